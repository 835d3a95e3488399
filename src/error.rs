//! Error formatting shared by modules that report errors from libraries with
//! deep cause chains (gix, reqwest, lettre). Formatting only.

/// An error with its chain of causes, `outer: inner: innermost`, skipping
/// causes whose text the outer message already contains.
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut msg = e.to_string();
    let mut cur = e.source();
    while let Some(inner) = cur {
        let s = inner.to_string();
        if !msg.contains(&s) {
            msg.push_str(": ");
            msg.push_str(&s);
        }
        cur = inner.source();
    }
    msg
}

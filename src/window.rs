//! Change windows (`windows = [{ allow = "…" }, { deny = "…" }]`): when a
//! target's work may start. Parses each entry, says whether windows are
//! open at an instant and when that next changes, and puts both in words.
//! Pure time arithmetic on `jiff`'s time zones; it knows nothing of jobs,
//! runs or configuration files, and decides nothing about what a closed
//! window holds back (that is `tick::window`'s).
//!
//! Local times are wall-clock times in the entry's IANA zone. On the night
//! a zone changes its offset a boundary is resolved as `jiff` resolves it
//! "compatibly": a time the clocks skip (02:30 when they jump from 02:00
//! to 03:00) is taken as the same distance after the jump (03:30), and a
//! time they pass twice (02:30 when they fall back from 03:00 to 02:00) as
//! its first occurrence. A window is therefore an hour shorter or longer
//! in real time on those nights, never missing and never doubled.
//!
//! The clock a window is judged by is [`now`]: the real time, which a
//! debug build (never a release build) lets tests move forward by the
//! number of seconds in the file `DRIFTLESS_DEBUG_CLOCK_FILE` names.

use jiff::civil::{Date, DateTime, Time, Weekday};
use jiff::tz::TimeZone;
use jiff::{Timestamp, ToSpan};

/// A target's windows: open when inside any `allow` entry (or when there
/// is none) and inside no `deny` entry — a deny wins. No entries: always
/// open.
#[derive(Debug, Clone, Default)]
pub struct Windows {
    pub entries: Vec<Entry>,
}

/// One `{ allow = "…" }` or `{ deny = "…" }`.
#[derive(Debug, Clone)]
pub struct Entry {
    pub allow: bool,
    /// As written, for messages.
    pub text: String,
    span: Span,
    tz: TimeZone,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Span {
    /// `Mon-Fri 09:00-17:00`: from `start` to `end` on each listed day
    /// (Monday first); an end not after the start is the next day's.
    Daily {
        days: [bool; 7],
        start: Time,
        end: Time,
        /// `24:00`: the end is the next midnight.
        end_midnight: bool,
    },
    /// `Fri 16:00 - Mon 08:00`: from one weekday's time to the next
    /// occurrence of the other's.
    Weekly {
        from: (Weekday, Time),
        to: (Weekday, Time),
        to_midnight: bool,
    },
    /// `2026-12-24 00:00 - 2026-12-27 00:00`: once.
    Once { from: DateTime, to: DateTime },
}

/// Whether windows are open at an instant, and when that changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct State {
    pub open: bool,
    /// When `open` next turns the other way; `None` when not within the
    /// coming year.
    pub next_change: Option<Timestamp>,
}

/// How far ahead a next change is looked for.
const HORIZON_DAYS: i64 = 366;

/// What an entry may look like, for messages.
pub const SHAPES: &str = "`Mon-Fri 09:00-17:00 Europe/Berlin`, `Fri 16:00 - Mon 08:00 Europe/Berlin` or `2026-12-24 00:00 - 2026-12-27 00:00 UTC`";

/// The clock windows are judged by: the real time, moved by the debug
/// clock in debug builds only.
pub fn now() -> Timestamp {
    let real = Timestamp::now();
    #[cfg(debug_assertions)]
    if let Some(moved) = debug_offset().and_then(|s| real.checked_add(s.seconds()).ok()) {
        return moved;
    }
    real
}

/// Seconds the debug clock file says to add (tests only).
#[cfg(debug_assertions)]
fn debug_offset() -> Option<i64> {
    let path = std::env::var_os("DRIFTLESS_DEBUG_CLOCK_FILE")?;
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// Whether the debug clock is in use (a debug build, its file named): a
/// job held back by a window then looks again every second, not every
/// minute, so a test that moves the clock sees it move.
pub fn debug_clock() -> bool {
    cfg!(debug_assertions) && std::env::var_os("DRIFTLESS_DEBUG_CLOCK_FILE").is_some()
}

impl Entry {
    /// Parse `text`, the value of an `allow` or `deny` key.
    pub fn parse(allow: bool, text: &str) -> Result<Entry, String> {
        let words: Vec<&str> = text.split_whitespace().collect();
        let Some((zone, body)) = words.split_last().filter(|(_, b)| !b.is_empty()) else {
            return Err(format!("`{text}`: expected {SHAPES}"));
        };
        let tz = TimeZone::get(zone).map_err(|_| {
            format!("`{text}`: `{zone}` is not a time zone: end with an IANA name such as Europe/Berlin, or UTC")
        })?;
        let span = span(&body.join(" ")).map_err(|e| format!("`{text}`: {e}"))?;
        Ok(Entry {
            allow,
            text: text.trim().to_string(),
            span,
            tz,
        })
    }

    /// The entry's stretches of time that may hold instants in `[lo, hi]`.
    fn stretches(&self, lo: Timestamp, hi: Timestamp) -> Vec<(Timestamp, Timestamp)> {
        let at = |d: Date, t: Time| self.tz.to_timestamp(d.to_datetime(t)).ok();
        let day = |ts: Timestamp| ts.to_zoned(self.tz.clone()).date();
        let mut out = Vec::new();
        match &self.span {
            Span::Once { from, to } => {
                if let (Ok(a), Ok(b)) = (self.tz.to_timestamp(*from), self.tz.to_timestamp(*to)) {
                    out.push((a, b));
                }
            }
            Span::Daily {
                days,
                start,
                end,
                end_midnight,
            } => {
                // A stretch lasts at most a day: it begins at most a day
                // before `lo`.
                for d in dates(day(lo).yesterday().ok(), day(hi)) {
                    if !days[d.weekday().to_monday_zero_offset() as usize] {
                        continue;
                    }
                    let next = d.tomorrow().ok();
                    let end_day = if *end_midnight || end <= start {
                        next
                    } else {
                        Some(d)
                    };
                    if let (Some(a), Some(b)) = (at(d, *start), end_day.and_then(|e| at(e, *end))) {
                        out.push((a, b));
                    }
                }
            }
            Span::Weekly {
                from,
                to,
                to_midnight,
            } => {
                for d in dates(day(lo).checked_sub(8.days()).ok(), day(hi)) {
                    if d.weekday() != from.0 {
                        continue;
                    }
                    let mut ahead = i64::from(to.0.since(from.0));
                    if *to_midnight {
                        ahead += 1;
                    } else if ahead == 0 && to.1 <= from.1 {
                        ahead = 7;
                    }
                    let end = d.checked_add(ahead.days()).ok();
                    if let (Some(a), Some(b)) = (at(d, from.1), end.and_then(|e| at(e, to.1))) {
                        out.push((a, b));
                    }
                }
            }
        }
        out.retain(|(a, b)| a < b);
        out
    }

    /// The entry in words: "Monday to Friday, 09:00 to 17:00 (Europe/Berlin)".
    pub fn words(&self) -> String {
        let zone = self.tz.iana_name().unwrap_or("UTC");
        let hm = |t: &Time, midnight: bool| {
            if midnight {
                "24:00".to_string()
            } else {
                format!("{:02}:{:02}", t.hour(), t.minute())
            }
        };
        let when = match &self.span {
            Span::Daily {
                days,
                start,
                end,
                end_midnight,
            } => {
                let crosses = !*end_midnight && end <= start;
                format!(
                    "{}, {} to {}{}",
                    day_list(days),
                    hm(start, false),
                    hm(end, *end_midnight),
                    if crosses { " the next day" } else { "" }
                )
            }
            Span::Weekly {
                from,
                to,
                to_midnight,
            } => format!(
                "from {} {} to the next {} {}",
                day_name(from.0),
                hm(&from.1, false),
                day_name(to.0),
                hm(&to.1, *to_midnight)
            ),
            Span::Once { from, to } => format!(
                "from {} to {}",
                from.strftime("%Y-%m-%d %H:%M"),
                to.strftime("%Y-%m-%d %H:%M")
            ),
        };
        format!("{when} ({zone})")
    }
}

impl Windows {
    /// No entries: always open.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Open at `t`, by `stretches` (each entry's, in order).
    fn open_in(&self, t: Timestamp, stretches: &[Vec<(Timestamp, Timestamp)>]) -> bool {
        let inside = |s: &Vec<(Timestamp, Timestamp)>| s.iter().any(|(a, b)| *a <= t && t < *b);
        let mut any_allow = false;
        let mut allowed = false;
        for (e, s) in self.entries.iter().zip(stretches) {
            if e.allow {
                any_allow = true;
                allowed |= inside(s);
            } else if inside(s) {
                return false;
            }
        }
        allowed || !any_allow
    }

    /// Whether the windows are open at `t`, and when that next changes.
    pub fn at(&self, t: Timestamp) -> State {
        if self.entries.is_empty() {
            return State {
                open: true,
                next_change: None,
            };
        }
        let mut open = None;
        // A week's look finds the next change of any weekly window; only a
        // long one-off entry needs the longer look.
        for days in [9, 64, HORIZON_DAYS] {
            let hi = t.checked_add((days * 24).hours()).unwrap_or(Timestamp::MAX);
            let lo = t.checked_sub(24.hours()).unwrap_or(Timestamp::MIN);
            let stretches: Vec<_> = self.entries.iter().map(|e| e.stretches(lo, hi)).collect();
            let now_open = *open.get_or_insert_with(|| self.open_in(t, &stretches));
            let mut edges: Vec<Timestamp> = stretches
                .iter()
                .flatten()
                .flat_map(|(a, b)| [*a, *b])
                .filter(|e| *e > t && *e <= hi)
                .collect();
            edges.sort();
            edges.dedup();
            if let Some(next) = edges
                .into_iter()
                .find(|e| self.open_in(*e, &stretches) != now_open)
            {
                return State {
                    open: now_open,
                    next_change: Some(next),
                };
            }
        }
        State {
            open: open.unwrap_or(true),
            next_change: None,
        }
    }

    /// The zone instants are shown in: the first entry's.
    pub fn zone(&self) -> TimeZone {
        self.entries
            .first()
            .map(|e| e.tz.clone())
            .unwrap_or(TimeZone::UTC)
    }

    /// `t` as people read it in the windows' zone: "Mon 08:00 CET", with
    /// the date when it is not within the coming six days of `now`.
    pub fn when(&self, t: Timestamp, now: Timestamp) -> String {
        let z = t.to_zoned(self.zone());
        let soon = t.as_second() - now.as_second() < 6 * 86_400;
        let fmt = if soon {
            "%a %H:%M %Z"
        } else {
            "%a %Y-%m-%d %H:%M %Z"
        };
        z.strftime(fmt).to_string()
    }

    /// The state at `now` in words: "open until Fri 16:00 CET", "closed;
    /// opens Mon 08:00 CET", "closed; opens not within a year".
    pub fn state_words(&self, now: Timestamp) -> String {
        let s = self.at(now);
        match (s.open, s.next_change) {
            (true, Some(t)) => format!("open until {}", self.when(t, now)),
            (true, None) => "open".into(),
            (false, Some(t)) => format!("closed; opens {}", self.when(t, now)),
            (false, None) => "closed; opens not within a year".into(),
        }
    }

    /// Every entry in words, allows then denies.
    pub fn words(&self) -> String {
        let list = |allow: bool| {
            self.entries
                .iter()
                .filter(|e| e.allow == allow)
                .map(Entry::words)
                .collect::<Vec<_>>()
                .join("; ")
        };
        let (allow, deny) = (list(true), list(false));
        match (allow.is_empty(), deny.is_empty()) {
            (true, true) => "always open".into(),
            (false, true) => format!("work may start only: {allow}"),
            (true, false) => format!("work may start any time but: {deny}"),
            (false, false) => {
                format!("work may start only: {allow}; and never: {deny} (a deny wins)")
            }
        }
    }
}

/// Every date from `from` (if there is one) to `to`, both included.
fn dates(from: Option<Date>, to: Date) -> impl Iterator<Item = Date> {
    let mut d = from;
    std::iter::from_fn(move || {
        let cur = d.filter(|c| *c <= to)?;
        d = cur.tomorrow().ok();
        Some(cur)
    })
}

const DAYS: [(&str, &str, Weekday); 7] = [
    ("mon", "monday", Weekday::Monday),
    ("tue", "tuesday", Weekday::Tuesday),
    ("wed", "wednesday", Weekday::Wednesday),
    ("thu", "thursday", Weekday::Thursday),
    ("fri", "friday", Weekday::Friday),
    ("sat", "saturday", Weekday::Saturday),
    ("sun", "sunday", Weekday::Sunday),
];

fn day_name(d: Weekday) -> &'static str {
    match d {
        Weekday::Monday => "Monday",
        Weekday::Tuesday => "Tuesday",
        Weekday::Wednesday => "Wednesday",
        Weekday::Thursday => "Thursday",
        Weekday::Friday => "Friday",
        Weekday::Saturday => "Saturday",
        Weekday::Sunday => "Sunday",
    }
}

/// "every day", "Monday to Friday", "Monday, Wednesday and Friday".
fn day_list(days: &[bool; 7]) -> String {
    let on: Vec<usize> = (0..7).filter(|i| days[*i]).collect();
    let name = |i: usize| day_name(DAYS[i].2);
    if on.len() == 7 {
        return "every day".into();
    }
    if on.len() > 2 && on.windows(2).all(|w| w[1] == w[0] + 1) {
        return format!("{} to {}", name(on[0]), name(on[on.len() - 1]));
    }
    let names: Vec<&str> = on.iter().map(|i| name(*i)).collect();
    match names.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} and {last}", rest.join(", ")),
        _ => names.join(""),
    }
}

fn weekday(s: &str) -> Result<Weekday, String> {
    let l = s.to_ascii_lowercase();
    DAYS.iter()
        .find(|(short, long, _)| l == *short || l == *long)
        .map(|d| d.2)
        .ok_or_else(|| format!("`{s}` is not a day (Mon, Tue, Wed, Thu, Fri, Sat, Sun)"))
}

/// `Mon-Fri`, `Sat,Sun`, `Fri-Mon` (wrapping), `Mon,Wed-Thu`.
fn day_set(s: &str) -> Result<[bool; 7], String> {
    let mut days = [false; 7];
    for part in s.split(',') {
        let idx = |d: &str| weekday(d).map(|w| w.to_monday_zero_offset() as usize);
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (idx(a)?, idx(b)?);
                let mut i = a;
                loop {
                    days[i] = true;
                    if i == b {
                        break;
                    }
                    i = (i + 1) % 7;
                }
            }
            None => days[idx(part)?] = true,
        }
    }
    Ok(days)
}

/// One piece of an entry's text.
#[derive(Debug, Clone, PartialEq)]
enum Atom {
    Days(String),
    Date(Date),
    /// The time, and whether it was written `24:00`.
    Time(Time, bool),
    Dash,
}

fn atoms(body: &str) -> Result<Vec<Atom>, String> {
    let chars: Vec<char> = body.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    let take = |i: &mut usize, ok: &dyn Fn(usize) -> bool| {
        let start = *i;
        while *i < chars.len() && ok(*i) {
            *i += 1;
        }
        chars[start..*i].iter().collect::<String>()
    };
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
        } else if c == '-' {
            out.push(Atom::Dash);
            i += 1;
        } else if c.is_ascii_alphabetic() {
            let word = take(&mut i, &|k| {
                chars[k].is_ascii_alphabetic()
                    || chars[k] == ','
                    || (chars[k] == '-'
                        && chars.get(k + 1).is_some_and(|n| n.is_ascii_alphabetic()))
            });
            out.push(Atom::Days(word));
        } else if c.is_ascii_digit() {
            let word = take(&mut i, &|k| chars[k].is_ascii_digit() || chars[k] == ':');
            if word.contains(':') {
                out.push(time(&word)?);
            } else if word.len() == 4 && chars.get(i) == Some(&'-') {
                let rest = take(&mut i, &|k| chars[k].is_ascii_digit() || chars[k] == '-');
                let text = format!("{word}{rest}");
                let d: Date = text
                    .parse()
                    .map_err(|_| format!("`{text}` is not a date (YYYY-MM-DD)"))?;
                out.push(Atom::Date(d));
            } else {
                return Err(format!("`{word}` is neither a time (HH:MM) nor a date"));
            }
        } else {
            return Err(format!("unexpected `{c}`; expected {SHAPES}"));
        }
    }
    Ok(out)
}

fn time(s: &str) -> Result<Atom, String> {
    let bad = || format!("`{s}` is not a time: use HH:MM, 00:00 to 24:00");
    let (h, m) = s.split_once(':').ok_or_else(bad)?;
    if !(1..=2).contains(&h.len()) || m.len() != 2 {
        return Err(bad());
    }
    let (h, m): (i8, i8) = (h.parse().map_err(|_| bad())?, m.parse().map_err(|_| bad())?);
    if (h, m) == (24, 0) {
        return Ok(Atom::Time(Time::midnight(), true));
    }
    Time::new(h, m, 0, 0)
        .map(|t| Atom::Time(t, false))
        .map_err(|_| bad())
}

fn span(body: &str) -> Result<Span, String> {
    use Atom::*;
    let shape = || format!("expected {SHAPES}");
    let midnight_start = || "a range begins at 00:00 to 23:59, not 24:00".to_string();
    match atoms(body)?.as_slice() {
        [Days(d), Time(start, s24), Dash, Time(end, e24)] => {
            if *s24 {
                return Err(midnight_start());
            }
            Ok(Span::Daily {
                days: day_set(d)?,
                start: *start,
                end: *end,
                end_midnight: *e24,
            })
        }
        [Days(a), Time(t1, s24), Dash, Days(b), Time(t2, e24)] => {
            if *s24 {
                return Err(midnight_start());
            }
            Ok(Span::Weekly {
                from: (weekday(a)?, *t1),
                to: (weekday(b)?, *t2),
                to_midnight: *e24,
            })
        }
        [Date(a), Time(t1, s24), Dash, Date(b), Time(t2, e24)] => {
            let at = |d: &jiff::civil::Date, t: &jiff::civil::Time, midnight: bool| {
                if midnight {
                    d.tomorrow()
                        .map(|n| n.to_datetime(jiff::civil::Time::midnight()))
                } else {
                    Ok(d.to_datetime(*t))
                }
            };
            let from = at(a, t1, *s24).map_err(|e| e.to_string())?;
            let to = at(b, t2, *e24).map_err(|e| e.to_string())?;
            if to <= from {
                return Err("the end is not after the start".into());
            }
            Ok(Span::Once { from, to })
        }
        _ => Err(shape()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(list: &[(bool, &str)]) -> Windows {
        Windows {
            entries: list
                .iter()
                .map(|(a, t)| Entry::parse(*a, t).expect(t))
                .collect(),
        }
    }

    fn ts(s: &str) -> Timestamp {
        s.parse().expect(s)
    }

    #[test]
    fn weekdays_in_office_hours() {
        let win = w(&[(true, "Mon-Fri 09:00-17:00 Europe/Berlin")]);
        // Friday 2026-12-04, 10:00 CET = 09:00Z: open until 17:00 CET.
        let s = win.at(ts("2026-12-04T09:00:00Z"));
        assert!(s.open);
        assert_eq!(s.next_change, Some(ts("2026-12-04T16:00:00Z")));
        // Friday 17:30 CET: closed until Monday 09:00 CET.
        let s = win.at(ts("2026-12-04T16:30:00Z"));
        assert!(!s.open);
        assert_eq!(s.next_change, Some(ts("2026-12-07T08:00:00Z")));
        assert_eq!(
            win.state_words(ts("2026-12-04T16:30:00Z")),
            "closed; opens Mon 09:00 CET"
        );
    }

    #[test]
    fn a_deny_wins_and_a_weekly_span_wraps_the_weekend() {
        let win = w(&[
            (true, "Mon-Sun 00:00-24:00 UTC"),
            (false, "Fri 16:00 - Mon 08:00 Europe/Berlin"),
        ]);
        // Saturday: denied, opens Monday 08:00 CET (07:00Z).
        let s = win.at(ts("2026-12-05T12:00:00Z"));
        assert!(!s.open);
        assert_eq!(s.next_change, Some(ts("2026-12-07T07:00:00Z")));
        // Thursday: open until Friday 16:00 CET.
        let s = win.at(ts("2026-12-03T12:00:00Z"));
        assert!(s.open);
        assert_eq!(s.next_change, Some(ts("2026-12-04T15:00:00Z")));
    }

    #[test]
    fn a_range_ending_before_it_starts_crosses_midnight() {
        let win = w(&[(true, "Sat 22:00-02:00 UTC")]);
        assert!(win.at(ts("2026-12-06T01:00:00Z")).open, "Sunday 01:00");
        assert!(!win.at(ts("2026-12-06T03:00:00Z")).open);
        assert!(!win.at(ts("2026-12-05T21:00:00Z")).open);
    }

    #[test]
    fn one_off_dates_and_the_long_look_ahead() {
        let win = w(&[(false, "2026-12-24 00:00 - 2027-01-20 00:00 UTC")]);
        let s = win.at(ts("2026-12-25T00:00:00Z"));
        assert!(!s.open);
        assert_eq!(s.next_change, Some(ts("2027-01-20T00:00:00Z")));
        assert_eq!(
            win.state_words(ts("2026-12-25T00:00:00Z")),
            "closed; opens Wed 2027-01-20 00:00 UTC"
        );
        assert!(win.at(ts("2027-02-01T00:00:00Z")).open);
    }

    #[test]
    fn dst_boundaries_resolve_compatibly() {
        // Europe/Berlin springs forward on 2027-03-28 at 02:00 to 03:00.
        let win = w(&[(true, "Sun 02:30-04:00 Europe/Berlin")]);
        // 02:30 does not exist that night: it opens at 03:30 CEST (01:30Z).
        let s = win.at(ts("2027-03-28T00:00:00Z"));
        assert!(!s.open);
        assert_eq!(s.next_change, Some(ts("2027-03-28T01:30:00Z")));
        // It falls back on 2026-10-25 from 03:00 to 02:00: 02:30 is its
        // first occurrence (00:30Z, still CEST).
        let s = win.at(ts("2026-10-25T00:00:00Z"));
        assert_eq!(s.next_change, Some(ts("2026-10-25T00:30:00Z")));
    }

    #[test]
    fn bad_entries_say_what_is_wrong() {
        for (text, says) in [
            ("Mon-Fry 09:00-17:00 Europe/Berlin", "`Fry` is not a day"),
            ("Mon-Fri 09:00-17:00 Mars/Olympus", "not a time zone"),
            ("Mon-Fri 09:00-17:00", "not a time zone"),
            ("Mon-Fri 25:00-17:00 UTC", "`25:00` is not a time"),
            ("Mon-Fri 09:00 UTC", "expected"),
            (
                "2026-12-27 00:00 - 2026-12-24 00:00 UTC",
                "not after the start",
            ),
            ("2026-13-01 00:00 - 2026-12-24 00:00 UTC", "not a date"),
            ("Mon 24:00-17:00 UTC", "begins at 00:00"),
            ("", "expected"),
        ] {
            let e = Entry::parse(true, text).expect_err(text);
            assert!(e.contains(says), "{text}: {e}");
        }
    }

    #[test]
    fn windows_in_words() {
        let win = w(&[
            (true, "Mon-Fri 09:00-17:00 Europe/Berlin"),
            (false, "2026-12-24 00:00 - 2026-12-27 00:00 Europe/Berlin"),
        ]);
        assert_eq!(
            win.words(),
            "work may start only: Monday to Friday, 09:00 to 17:00 (Europe/Berlin); and never: from 2026-12-24 00:00 to 2026-12-27 00:00 (Europe/Berlin) (a deny wins)"
        );
        assert_eq!(
            w(&[(true, "Sat,Sun 22:00-02:00 UTC")]).entries[0].words(),
            "Saturday and Sunday, 22:00 to 02:00 the next day (UTC)"
        );
        assert!(Windows::default().at(ts("2026-12-04T09:00:00Z")).open);
    }
}

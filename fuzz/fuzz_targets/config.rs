//! Config parsing and validation: any text gives settings or a list of
//! problems, never a panic; every problem names where it is.
#![no_main]
use std::path::Path;

use driftless::config::{ConfigError, from_toml_str};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let path = Path::new("/fuzz/driftless.toml");
    match from_toml_str(text, path, Path::new("/fuzz")) {
        Ok(_) => {}
        Err(ConfigError::Invalid { problems, .. }) => {
            assert!(!problems.is_empty(), "invalid, with no problem named");
            for p in &problems {
                assert!(!p.to_string().is_empty());
            }
        }
        Err(e) => assert!(!e.to_string().is_empty()),
    }
});

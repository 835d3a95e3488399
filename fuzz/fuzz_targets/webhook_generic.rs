//! Signature check + payload parsing for Generic deliveries.
#![no_main]
use driftless::config::ForgeKind;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| driftless_fuzz::check(ForgeKind::Generic, data));

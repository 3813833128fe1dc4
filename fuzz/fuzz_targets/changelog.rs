#![no_main]
// See loopwarden::fuzz::changelog for the input and what is checked.
libfuzzer_sys::fuzz_target!(|data: &[u8]| loopwarden::fuzz::changelog(data));

#![no_main]
// See loopwarden::fuzz::otlp_json for the input and what is checked.
libfuzzer_sys::fuzz_target!(|data: &[u8]| loopwarden::fuzz::otlp_json(data));

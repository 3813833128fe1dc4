#![no_main]
// See loopwarden::tools::fuzz::otlp_json for the input and what is checked.
libfuzzer_sys::fuzz_target!(|data: &[u8]| loopwarden::tools::fuzz::otlp_json(data));

#![no_main]
// See loopwarden::tools::fuzz::event_json for the input and what is checked.
libfuzzer_sys::fuzz_target!(|data: &[u8]| loopwarden::tools::fuzz::event_json(data));

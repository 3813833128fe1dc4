//! A consumed message's headers, read as bytes. rdkafka's own reader (`Headers::iter`,
//! `get`, `try_get`) unwraps every header's name as UTF-8, and Kafka does not ask names
//! to be: one message from a producer that writes raw bytes there would panic the worker
//! that polls it, and, never committed, every instance that polls it after. Everything
//! loopwarden reads from the headers of a message it did not write goes through here.
//!
//! Guarantees: never panics on a message's headers; names are compared as bytes.

use std::ffi::CStr;

use rdkafka::bindings as rd;
use rdkafka::message::{BorrowedHeaders, Headers, OwnedHeaders};

// rdkafka's `BorrowedHeaders` is a zero-sized type whose address is librdkafka's header
// list (its own `as_native_ptr` casts so): a change of that fails the build here.
const _: () = assert!(std::mem::size_of::<BorrowedHeaders>() == 0);

/// Headers whose native list can be read directly: a polled message's and an owned
/// copy's.
pub trait RawHeaders {
    fn borrowed(&self) -> &BorrowedHeaders;
}

impl RawHeaders for BorrowedHeaders {
    fn borrowed(&self) -> &BorrowedHeaders {
        self
    }
}

impl RawHeaders for OwnedHeaders {
    fn borrowed(&self) -> &BorrowedHeaders {
        self.as_borrowed()
    }
}

/// Each header in order: its name's bytes and its value (`None`: a null value).
pub fn each<H: RawHeaders>(headers: &H) -> impl Iterator<Item = (&[u8], Option<&[u8]>)> {
    let borrowed = headers.borrowed();
    // What rdkafka's `BorrowedHeaders` is: the address of librdkafka's header list.
    let native = borrowed as *const BorrowedHeaders as *const rd::rd_kafka_headers_t;
    (0..borrowed.count()).filter_map(move |idx| {
        let mut name = std::ptr::null();
        let mut value = std::ptr::null();
        let mut size = 0usize;
        // SAFETY: `native` is a live header list (borrowed for the iterator's lifetime,
        // as the names and values returned are) and the three out-pointers outlive the
        // call; an index past the end is an error, not a read.
        let err =
            unsafe { rd::rd_kafka_header_get_all(native, idx, &mut name, &mut value, &mut size) };
        if err != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR || name.is_null() {
            return None;
        }
        // SAFETY: librdkafka keeps each name NUL-terminated and each value `size` bytes
        // long, both owned by the list.
        let name = unsafe { CStr::from_ptr(name) }.to_bytes();
        let value = (!value.is_null())
            .then(|| unsafe { std::slice::from_raw_parts(value.cast::<u8>(), size) });
        Some((name, value))
    })
}

/// The value of the first header named `name`: `None` when there is none or its value is
/// null.
pub fn value<'a, H: RawHeaders>(headers: &'a H, name: &str) -> Option<&'a [u8]> {
    each(headers)
        .find(|(n, _)| *n == name.as_bytes())
        .and_then(|(_, v)| v)
}

/// `headers` with one more header whose name is `name`'s bytes, as any producer may write
/// it (rdkafka's own `insert` takes UTF-8 names only): for tests of what a consumer of
/// ours meets.
pub fn with_raw_name(headers: OwnedHeaders, name: &[u8], value: &[u8]) -> OwnedHeaders {
    let native = headers.as_borrowed() as *const BorrowedHeaders as *mut rd::rd_kafka_headers_t;
    // SAFETY: the list is owned here (taken by value) and not read meanwhile; librdkafka
    // copies the name and the value, whose lengths are given.
    let err = unsafe {
        rd::rd_kafka_header_add(
            native,
            name.as_ptr().cast(),
            name.len() as isize,
            value.as_ptr().cast(),
            value.len() as isize,
        )
    };
    // Only a read-only list refuses an add, and an owned one is not.
    debug_assert_eq!(err, rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR);
    headers
}

#[cfg(test)]
mod tests {
    use rdkafka::message::Header;

    use super::*;

    #[test]
    fn a_name_that_is_not_utf8_is_read_as_bytes() {
        let h = OwnedHeaders::new().insert(Header {
            key: "a",
            value: Some(b"1".as_slice()),
        });
        let h = with_raw_name(h, b"\xff\xfe", b"2");
        let h = h.insert(Header::<&[u8]> {
            key: "Traceparent",
            value: None,
        });
        let h = h.insert(Header {
            key: "traceparent",
            value: Some(b"00-x".as_slice()),
        });
        let all: Vec<_> = each(&h).collect();
        assert_eq!(
            all,
            [
                (b"a".as_slice(), Some(b"1".as_slice())),
                (b"\xff\xfe".as_slice(), Some(b"2".as_slice())),
                (b"Traceparent".as_slice(), None),
                (b"traceparent".as_slice(), Some(b"00-x".as_slice())),
            ]
        );
        // The first of the name, as written.
        assert_eq!(value(&h, "Traceparent"), None);
        assert_eq!(value(&h, "traceparent"), Some(b"00-x".as_slice()));
        assert_eq!(value(&h, "a"), Some(b"1".as_slice()));
        assert_eq!(value(&h, "missing"), None);
        // What this module is for: rdkafka's reader panics on that name (an rdkafka that
        // does not fails this: the module may go then).
        let rdkafka = std::panic::catch_unwind(|| h.iter().count());
        assert!(
            rdkafka.is_err(),
            "rdkafka reads such a name now: this module may go"
        );
    }
}

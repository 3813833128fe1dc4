//! loopwarden's change to sled's page cache (`vendor/sled/LOOPWARDEN.md`), held by a test
//! that fails on the published crate: a cache of 8 MiB (`state.cache_mib`'s default) holds
//! no more than 8 MiB of pages of half a MiB (a leaf of twenty 25 KiB records). sled 0.34.7
//! split any capacity over 256 shards, each of which keeps the page it was last asked for
//! whatever its size: 256 such pages, 128 MiB.

#[test]
fn a_page_cache_holds_no_more_than_its_capacity_of_large_pages() {
    const MIB: u64 = 1024 * 1024;
    let capacity = 8 * MIB;
    let page = MIB / 2;
    // Enough reads that every shard of the published crate's 256 applies its queued
    // accesses (it does so 64 at a time).
    let held = sled::loopwarden_page_cache_holds(capacity, page, 256 * 256);
    assert!(
        held <= capacity,
        "a page cache of {capacity} bytes holds {held} bytes of {page}-byte pages"
    );
    assert!(
        held >= capacity / 2,
        "a page cache of {capacity} bytes read through holds only {held} bytes"
    );
}

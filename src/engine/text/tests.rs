//! Unit tests of `text`.

use super::*;

fn chant(text: &str) -> Option<Chant> {
    let rule = ChantRule {
        chunk: 50,
        min_repeats: 10,
        max_spacing: 250,
    };
    find_chant(text, rule, &mut ChantScratch::default())
}

/// The merge walk written with a branch per case, as the definition.
fn similarity_by_cases(x: &TextSketch, y: &TextSketch) -> f64 {
    if x.is_empty() && y.is_empty() {
        return 1.0;
    }
    let (a, b) = (x.mins(), y.mins());
    let limit = if x.complete && y.complete {
        usize::MAX
    } else {
        SKETCH_K
    };
    let (mut i, mut j, mut union, mut common) = (0, 0, 0usize, 0usize);
    while union < limit && (i < a.len() || j < b.len()) {
        match (a.get(i), b.get(j)) {
            (Some(p), Some(q)) if p == q => {
                common += 1;
                i += 1;
                j += 1;
            }
            (Some(p), Some(q)) if p < q => i += 1,
            (Some(_), Some(_)) => j += 1,
            (Some(_), None) if !y.complete => break,
            (Some(_), None) => i += 1,
            (None, Some(_)) if !x.complete => break,
            (None, Some(_)) => j += 1,
            (None, None) => break,
        }
        union += 1;
    }
    if union == 0 {
        0.0
    } else {
        common as f64 / union as f64
    }
}

proptest::proptest! {
    /// Lanes and places agree, the refusals and drops included, and unused places
    /// stay `u32::MAX`.
    #[test]
    fn inserts_on_lanes_are_inserts_by_places(
        values in proptest::collection::vec(
            proptest::prop_oneof![0u32..40, proptest::num::u32::ANY, proptest::strategy::Just(u32::MAX)],
            0..60,
        ),
    ) {
        let (mut lanes, mut places) = (Mins::default(), Mins::default());
        for v in values {
            proptest::prop_assert_eq!(lanes.insert(v), places.insert_by_places(v), "{}", v);
            proptest::prop_assert_eq!(lanes, places);
            let len = lanes.len as usize;
            proptest::prop_assert!(lanes.vals[len..].iter().all(|&x| x == u32::MAX));
            proptest::prop_assert!(lanes.as_slice().windows(2).all(|w| w[0] < w[1]));
        }
    }
}

proptest::proptest! {
    /// Sketches of token sets drawn from a small vocabulary (so that they overlap):
    /// the bottom-k set of distinct hashes, and the similarity of the walk by cases.
    #[test]
    fn sketches_keep_the_smallest_hashes_and_compare_by_the_walk(
        a in proptest::collection::vec(0u32..60, 0..40),
        b in proptest::collection::vec(0u32..60, 0..40),
    ) {
        let text = |t: &[u32]| t.iter().map(|w| format!("w{w}")).collect::<Vec<_>>().join(" ");
        let (x, y) = (TextSketch::of(&text(&a)), TextSketch::of(&text(&b)));
        let mut hashes: Vec<u32> = a.iter().map(|w| crate::engine::hash::token_hash(format!("w{w}").as_bytes())).collect();
        hashes.sort_unstable();
        hashes.dedup();
        proptest::prop_assert_eq!(x.complete, hashes.len() <= SKETCH_K);
        hashes.truncate(SKETCH_K);
        proptest::prop_assert_eq!(x.mins(), &hashes[..]);
        proptest::prop_assert_eq!(x.similarity(&y), similarity_by_cases(&x, &y));
        proptest::prop_assert_eq!(y.similarity(&x), similarity_by_cases(&y, &x));
        for min in [0.0, 0.3, 0.5, 0.85, 0.9375, 1.0] {
            proptest::prop_assert_eq!(x.similar_at_least(&y, min), x.similarity(&y) >= min, "{}", min);
        }
    }
}

#[test]
fn identical_short_texts_are_fully_similar() {
    let a = TextSketch::of("I'm doing well, thanks for asking.");
    assert!(a.complete);
    assert_eq!(a.similarity(&a.clone()), 1.0);
}

#[test]
fn similarity_is_exact_for_small_texts_and_case_insensitive() {
    let a = TextSketch::of("step 1 inspecting module one");
    let b = TextSketch::of("STEP 2 inspecting module one");
    // {step,1,inspecting,module,one} vs {step,2,...}: 4 shared of 6.
    assert!((a.similarity(&b) - 4.0 / 6.0).abs() < 1e-9);
}

#[test]
fn similarity_estimate_tracks_large_texts() {
    let base: Vec<String> = (0..200).map(|i| format!("w{i}")).collect();
    let a = TextSketch::of(&base.join(" "));
    let mut other = base.clone();
    other.truncate(180);
    other.extend((0..20).map(|i| format!("x{i}")));
    let b = TextSketch::of(&other.join(" "));
    assert!(!a.complete);
    let s = a.similarity(&b);
    assert!(s > 0.5 && s < 1.0, "{s}");
    let far = TextSketch::of(
        &(0..200)
            .map(|i| format!("z{i}"))
            .collect::<Vec<_>>()
            .join(" "),
    );
    assert!(a.similarity(&far) < 0.2);
}

/// The exact search alone, without the cheap pass in front of it.
fn find_chant_exact(
    s: &[u8],
    chunk: usize,
    min_repeats: u32,
    max_spacing: usize,
    scratch: &mut ChantScratch,
) -> Option<Chant> {
    if s.len() < chunk + min_repeats as usize - 1 {
        return None;
    }
    let ChantScratch {
        prev,
        slots,
        generation,
        ..
    } = scratch;
    window_search(s, chunk, min_repeats, max_spacing, prev, slots, generation)
}

#[test]
fn the_cheap_pass_never_rules_out_a_chant() {
    // Texts that chant, and texts that nearly do: the answer is the exact search's.
    let unit = "We need to check the config again before going on. ";
    let mut chants = 0;
    for repeats in [8, 9, 10, 11, 12] {
        for filler in ["", "x ", "some other words in between here "] {
            let text = format!("{filler}{}", format!("{unit}{filler}").repeat(repeats));
            let fast = chant(&text);
            let mut prose_bytes = Vec::new();
            prose(&text, &mut prose_bytes);
            let mut slow = ChantScratch::default();
            let exact = find_chant_exact(&prose_bytes, 50, 10, 250, &mut slow);
            assert_eq!(fast, exact, "{repeats} repeats, filler {filler:?}");
            chants += usize::from(exact.is_some());
        }
    }
    assert!(chants > 0 && chants < 15, "{chants} of 15 chant");
}

proptest::proptest! {
    /// The word-start count rules out only texts the exact search finds no chant in.
    #[test]
    fn word_grams_never_rule_out_a_chant(
        unit in "[ab \n]{1,30}[a-z]{0,50}",
        filler in "[a-c \n]{0,40}",
        repeats in 2usize..14,
        chunk in 8usize..40,
        min_repeats in 2u32..12,
    ) {
        let text = format!("{filler}{}", format!("{unit}{filler}").repeat(repeats));
        let s = text.as_bytes();
        let mut scratch = ChantScratch::default();
        let exact = find_chant_exact(s, chunk, min_repeats, 10_000, &mut scratch);
        if exact.is_some() {
            proptest::prop_assert!(word_gram_may_recur(s, chunk, min_repeats, &mut Vec::new()));
        }
    }

    /// The count over the whole text rules out only texts whose prose the exact
    /// search finds no chant in, whatever lines the prose leaves out between the
    /// repeats (so that the prose joins lines the text keeps apart).
    #[test]
    fn line_grams_never_rule_out_a_chant_in_the_prose(
        unit in "[ab \n]{1,12}[a-z]{0,12}",
        markers in proptest::collection::vec(
            proptest::prop_oneof![
                proptest::strategy::Just("|"),
                proptest::strategy::Just("#"),
                proptest::strategy::Just(">"),
                proptest::strategy::Just("-"),
                proptest::strategy::Just("```\n```"),
            ],
            0..4,
        ),
        repeats in 2usize..14,
        chunk in 9usize..40,
        min_repeats in 2u32..12,
        ends_with_break in proptest::bool::ANY,
    ) {
        // Each repeat followed by layout lines of its own (numbered): the prose joins
        // the repeats, the text keeps them apart with different bytes each time.
        let mut text = String::new();
        for i in 0..repeats {
            text.push_str(&unit);
            for m in &markers {
                text.push_str(&format!("\n{m} {i}"));
            }
            text.push('\n');
        }
        if !ends_with_break {
            text.pop();
        }
        let mut prose_bytes = Vec::new();
        prose(&text, &mut prose_bytes);
        let exact = find_chant_exact(&prose_bytes, chunk, min_repeats, 10_000, &mut ChantScratch::default());
        if exact.is_some() {
            proptest::prop_assert!(line_gram_may_recur(text.as_bytes(), chunk, min_repeats, &mut Vec::new()));
        }
    }

    /// A chanted word glued to a different prefix each time: no word-start gram
    /// repeats, only the long runs without whitespace give it away.
    #[test]
    fn a_chant_inside_long_words_is_not_ruled_out(
        word in "[a-z]{9,60}",
        repeats in 2usize..14,
        min_repeats in 2u32..12,
        chunk_cut in 0usize..50,
    ) {
        let text: String = (0..repeats)
            .map(|i| {
                let prefix: String = format!("{:08}", i * 7919)
                    .bytes()
                    .map(|d| (b'k' + d - b'0') as char)
                    .collect();
                format!("{prefix}{word} ")
            })
            .collect();
        let chunk = 9 + chunk_cut % (word.len() - 8);
        let s = text.as_bytes();
        let exact = find_chant_exact(s, chunk, min_repeats, 10_000, &mut ChantScratch::default());
        proptest::prop_assert_eq!(exact.is_some(), repeats >= min_repeats as usize);
        if exact.is_some() {
            proptest::prop_assert!(word_gram_may_recur(s, chunk, min_repeats, &mut Vec::new()));
        }
    }
}

proptest::proptest! {
    /// The one pass gives what the sketch and the chant search give on their own.
    #[test]
    fn turn_features_are_the_sketch_and_the_chant(
        unit in "[a-c \n]{1,20}[a-z]{0,30}",
        filler in "[a-c \n|#-]{0,30}",
        repeats in 1usize..16,
        chunk in 0usize..60,
        min_repeats in 0u32..12,
        sketch in proptest::bool::ANY,
    ) {
        let text = format!("{filler}{}", format!("{unit}{filler}").repeat(repeats));
        let rule = ChantRule { chunk, min_repeats, max_spacing: 250 };
        let (s, c) = turn_features(&text, sketch, rule, &mut ChantScratch::default());
        proptest::prop_assert_eq!(s, sketch.then(|| TextSketch::of(&text)));
        proptest::prop_assert_eq!(c, find_chant(&text, rule, &mut ChantScratch::default()));
    }
}

#[test]
fn line_grams_end_at_the_first_line_break_or_the_text() {
    let g = |s: &str, at: usize| line_gram(s.as_bytes(), at).to_le_bytes();
    assert_eq!(&g("abcdefghij", 1), b"bcdefghi");
    assert_eq!(&g("ab\ncdefghij", 0), b"ab\n\0\0\0\0\0");
    assert_eq!(&g("abcdefg\nhij", 0), b"abcdefg\n");
    assert_eq!(&g("xyz", 1), b"yz\n\0\0\0\0\0");
    assert_eq!(&g("xyz", 3), b"\n\0\0\0\0\0\0\0");
}

#[test]
fn chanting_is_found() {
    let text = "Let me reconsider the approach. ".repeat(40);
    let c = chant(&text).expect("chant");
    assert!(c.repeats >= 10);
    assert!(c.avg_spacing <= 250.0);
}

#[test]
fn a_long_text_searched_leaves_no_large_buffers_behind() {
    let rule = ChantRule {
        chunk: 50,
        min_repeats: 10,
        max_spacing: 250,
    };
    let long = "Let me reconsider the approach. ".repeat(32_768); // 1 MiB
    let short = "Let me reconsider the approach. ".repeat(40);
    let mut scratch = ChantScratch::default();
    assert!(find_chant(&long, rule, &mut scratch).is_some());
    scratch.trim();
    assert!(
        scratch.held_bytes() <= CHANT_SCRATCH_KEPT_BYTES,
        "{} bytes kept",
        scratch.held_bytes()
    );
    let (_, chant) = turn_features(&long, true, rule, &mut scratch);
    assert!(chant.is_some());
    scratch.trim();
    assert!(scratch.held_bytes() <= CHANT_SCRATCH_KEPT_BYTES);
    // What a buffer let go of does not change what is found next.
    assert_eq!(
        find_chant(&short, rule, &mut scratch),
        find_chant(&short, rule, &mut ChantScratch::default())
    );
    scratch.trim();
    assert!(scratch.held_bytes() > 0, "small buffers are kept");
    // A long turn of 64 KiB keeps its table (reused, not allocated and zeroed each turn).
    let longish = "Let me reconsider the approach. ".repeat(2_048);
    assert!(find_chant(&longish, rule, &mut scratch).is_some());
    scratch.trim();
    assert!(scratch.held_bytes() > 2 << 20, "{}", scratch.held_bytes());
}

#[test]
fn nine_repeats_are_not_enough() {
    let unit = "This exact sentence repeats here exactly, twice over!! ";
    assert!(unit.len() >= 50);
    let text = format!(
        "{}{}",
        unit.repeat(9),
        "and then something else entirely different happens in the end."
    );
    assert_eq!(chant(&text), None);
    let ten = unit.repeat(11);
    assert!(chant(&ten).is_some());
}

#[test]
fn far_apart_repeats_are_not_chanting() {
    // Filler that never repeats itself: 300 bytes of counting words per gap.
    let text: String = (0..12)
        .map(|i| {
            let filler: String = (0..60).map(|j| format!("{:04} ", i * 100 + j)).collect();
            format!("The same sentence shows up here again and again. {filler}")
        })
        .collect();
    assert_eq!(chant(&text), None);
}

#[test]
fn layout_is_skipped() {
    let divider = "-".repeat(80);
    let text = format!("{}\n", divider).repeat(20);
    assert_eq!(chant(&text), None);
    let table = "| col a | col b | col c | col d | col e | col f | g |\n".repeat(20);
    assert_eq!(chant(&table), None);
    let code = format!(
        "```\n{}```\n",
        "print('hello world, this is a long line of code!!')\n".repeat(20)
    );
    assert_eq!(chant(&code), None);
    let list = "- item that looks the same in every single line here\n".repeat(20);
    assert_eq!(chant(&list), None);
}

#[test]
fn an_opening_is_its_first_words_whatever_the_markup() {
    let a = opening(
        "<thoughts>\nYou're right - I should make a tool call to search",
        8,
    );
    let b = opening(
        "<thoughts> you're RIGHT: I should make a tool call, then edit",
        8,
    );
    assert!(a.is_some());
    assert_eq!(a, b);
    assert_ne!(
        a,
        opening("You're right - I should make two tool calls to search", 8)
    );
    assert_eq!(opening("Too short to open", 8), None);
    assert_eq!(opening("anything at all here", 0), None);
}

/// `opening` as first written, char by char.
fn opening_reference(text: &str, words: usize) -> Option<u64> {
    if words == 0 {
        return None;
    }
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut mix = |b: u8| {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    };
    let (mut seen, mut in_word) = (0, false);
    for c in text.chars() {
        if c.is_alphanumeric() {
            if !in_word {
                if seen == words {
                    break;
                }
                seen += 1;
                in_word = true;
                mix(b' ');
            }
            for l in c.to_lowercase() {
                let mut buf = [0u8; 4];
                l.encode_utf8(&mut buf).bytes().for_each(&mut mix);
            }
        } else {
            in_word = false;
        }
    }
    (seen == words).then_some(h.max(1))
}

proptest::proptest! {
    /// The ASCII fast path reads every text as the char-by-char reference does,
    /// non-ASCII letters (`İ`, `Σ`, `é`), digits and marks included.
    #[test]
    fn opening_matches_the_reference(
        text in "[a-zA-Z0-9 ,.!'İΣéß日本\u{301}_-]{0,80}",
        words in 0usize..10,
    ) {
        proptest::prop_assert_eq!(opening(&text, words), opening_reference(&text, words));
    }
}

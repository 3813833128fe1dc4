//! The fast path: the event's fields read straight from its text, `args`, `result` and
//! `text` kept as their JSON text. It accepts only what serde_json would read the same
//! way (see [`crate::contract::json::Scanner`]) and gives up on anything else, errors included.

use std::borrow::Cow;

use super::{Str, Wire};
use crate::contract::json::{unescape, Bail, Json, NumKind, Scanner};

struct Reader<'a> {
    text: &'a str,
    sc: Scanner<'a>,
    /// Fields already read: a second one is serde's "duplicate field" error.
    seen: u64,
}

impl<'a> Reader<'a> {
    fn once(&mut self, bit: u32) -> Result<(), Bail> {
        if self.seen & (1 << bit) != 0 {
            return Err(Bail);
        }
        self.seen |= 1 << bit;
        Ok(())
    }

    fn string(&mut self) -> Result<Option<Str<'a>>, Bail> {
        if self.sc.null() {
            return Ok(None);
        }
        let span = self.sc.string()?;
        Ok(Some(unescape(
            &self.text[span.start..span.end],
            span.escaped,
        )))
    }

    fn number(&mut self) -> Result<Option<(&'a str, NumKind)>, Bail> {
        if self.sc.null() {
            return Ok(None);
        }
        let (start, end, kind) = self.sc.number()?;
        Ok(Some((&self.text[start..end], kind)))
    }

    fn unsigned(&mut self) -> Result<Option<u64>, Bail> {
        match self.number()? {
            None => Ok(None),
            Some((digits, NumKind::Integer)) if !digits.starts_with('-') => {
                digits.parse::<u64>().map(Some).map_err(|_| Bail)
            }
            Some(_) => Err(Bail),
        }
    }

    fn small(&mut self) -> Result<Option<u32>, Bail> {
        match self.unsigned()? {
            None => Ok(None),
            Some(n) => u32::try_from(n).map(Some).map_err(|_| Bail),
        }
    }

    fn float(&mut self) -> Result<Option<f64>, Bail> {
        match self.number()? {
            None => Ok(None),
            // serde_json reads a non-negative integer as u64, then converts.
            Some((digits, NumKind::Integer)) if !digits.starts_with('-') => {
                match digits.parse::<u64>() {
                    Ok(n) => Ok(Some(n as f64)),
                    Err(_) => serde_json::from_str(digits).map(Some).map_err(|_| Bail),
                }
            }
            Some((text, _)) => serde_json::from_str(text).map(Some).map_err(|_| Bail),
        }
    }

    fn boolean(&mut self) -> Result<Option<bool>, Bail> {
        if self.sc.null() {
            return Ok(None);
        }
        self.sc.boolean().map(Some)
    }

    fn json(&mut self) -> Result<Option<Json<'a>>, Bail> {
        if self.sc.null() {
            return Ok(None);
        }
        let start = self.sc.value()?;
        Ok(Some(Json(Cow::Borrowed(&self.text[start..self.sc.pos]))))
    }

    fn json_keeping_null(&mut self) -> Result<Option<Json<'a>>, Bail> {
        if self.sc.null() {
            return Ok(Some(Json(Cow::Borrowed("null"))));
        }
        self.json()
    }

    fn string_literal(&mut self) -> Result<Option<Json<'a>>, Bail> {
        if self.sc.null() {
            return Ok(None);
        }
        let start = self.sc.pos;
        self.sc.string()?;
        Ok(Some(Json(Cow::Borrowed(&self.text[start..self.sc.pos]))))
    }
}

pub(super) fn read(text: &str, max_nesting: usize) -> Result<Wire<'_>, Bail> {
    let mut r = Reader {
        text,
        sc: Scanner::new(text.as_bytes(), max_nesting),
        seen: 0,
    };
    let mut w = Wire::default();
    r.sc.ws();
    r.sc.open(b'{')?;
    r.sc.ws();
    if r.sc.peek() == Some(b'}') {
        r.sc.pos += 1;
    } else {
        loop {
            r.sc.ws();
            let key = r.sc.string()?;
            if key.escaped {
                return Err(Bail);
            }
            r.sc.ws();
            r.sc.eat(b':')?;
            r.sc.ws();
            field(&mut r, &mut w, &text.as_bytes()[key.start..key.end])?;
            r.sc.ws();
            match r.sc.peek() {
                Some(b',') => r.sc.pos += 1,
                Some(b'}') => {
                    r.sc.pos += 1;
                    break;
                }
                _ => return Err(Bail),
            }
        }
    }
    r.sc.close();
    r.sc.ws();
    if !r.sc.at_end() {
        return Err(Bail);
    }
    Ok(w)
}

fn field<'a>(r: &mut Reader<'a>, w: &mut Wire<'a>, key: &[u8]) -> Result<(), Bail> {
    macro_rules! read {
        ($bit:expr, $slot:ident, $how:ident) => {{
            r.once($bit)?;
            w.$slot = r.$how()?;
        }};
    }
    match key {
        b"type" => read!(0, kind, string),
        b"session_id" => read!(1, session_id, string),
        b"event_id" => read!(2, event_id, string),
        b"timestamp" => read!(3, timestamp, string),
        b"run_id" => read!(4, run_id, string),
        b"agent_id" => read!(5, agent_id, string),
        b"tenant" => read!(6, tenant, string),
        b"parent_session_id" => read!(7, parent_session_id, string),
        b"depth" => read!(8, depth, small),
        b"input_tokens" => read!(9, input_tokens, unsigned),
        b"output_tokens" => read!(10, output_tokens, unsigned),
        b"cache_read_tokens" => read!(11, cache_read_tokens, unsigned),
        b"cache_write_tokens" => read!(12, cache_write_tokens, unsigned),
        b"cost_usd" => read!(13, cost_usd, float),
        b"model" => read!(14, model, string),
        b"tool_calls" => read!(15, tool_calls, small),
        b"text" => read!(16, text, string_literal),
        b"finish_reason" => read!(17, finish_reason, string),
        b"call_kind" => read!(18, call_kind, string),
        b"progress" => read!(19, progress, float),
        b"turn" => read!(20, turn, unsigned),
        b"tool" => read!(21, tool, string),
        b"args" => read!(22, args, json),
        // A `null` result is a result (the tool said nothing), kept as written; an
        // absent one is unknown.
        b"result" => read!(23, result, json_keeping_null),
        b"result_digest" => read!(24, result_digest, string),
        b"is_error" => read!(25, is_error, boolean),
        b"error_kind" => read!(26, error_kind, string),
        b"duration_ms" => read!(27, duration_ms, float),
        b"call_id" => read!(28, call_id, string),
        b"stop_reason" => read!(29, stop_reason, string),
        b"outcome" => read!(30, outcome, string),
        b"trace_id" => read!(31, trace_id, string),
        _ => {
            r.sc.value()?;
        }
    }
    Ok(())
}

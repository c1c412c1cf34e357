//! A trace's lines read on two threads and handed over in order.
//!
//! Deserializing a line needs nothing from the lines before it; importing
//! it does. So the text is cut into chunks of whole lines that this thread
//! and one helper claim in turn and deserialize, while this thread hands
//! each chunk's lines, in file order, to the importer as soon as the chunk
//! is ready. This thread never waits: finding the next chunk not ready, it
//! reads the next unclaimed one, or, when none is left, the one the helper
//! is still reading; so the work balances itself whether or not the helper
//! gets a core. The result is the one a single thread gives.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};

use super::numbered_lines;

/// Bytes per chunk (then on to the line's end): small enough that the
/// threads finish close together, large enough that handing over is rare.
const CHUNK_BYTES: usize = 16 * 1024;

/// Texts shorter than this are read on this thread alone: below it the
/// helper's start, and on a busy machine its sharing of this thread's core,
/// cost about what it saves (`cargo bench --bench trace_read`: U-Net's
/// 0.14 MB log read no faster on two threads).
const TWO_THREADS_FROM: usize = 16 * CHUNK_BYTES;

/// One chunk's lines, read.
struct Chunk<T> {
    /// Each non-blank line: its number within the chunk, and what it read as.
    items: Vec<(usize, T)>,
    /// Lines in the chunk, blank ones too (to number the next chunk's).
    lines: usize,
    /// The first line that did not read, with why; `items` stops before it.
    error: Option<(usize, String)>,
}

/// `text`'s chunks: whole lines, each chunk but the last ending in `\n`.
fn chunks(text: &str) -> Vec<&str> {
    let mut chunks = Vec::with_capacity(text.len() / CHUNK_BYTES + 1);
    let mut rest = text;
    while rest.len() > CHUNK_BYTES {
        let Some(newline) = memchr::memchr(b'\n', &rest.as_bytes()[CHUNK_BYTES..]) else {
            break;
        };
        let (chunk, after) = rest.split_at(CHUNK_BYTES + newline + 1);
        chunks.push(chunk);
        rest = after;
    }
    if !rest.is_empty() {
        chunks.push(rest);
    }
    chunks
}

/// Reads a chunk's lines into `items` (empty); once `stop` is set (nothing
/// more will be handed over) it gives up, leaving a chunk no one uses.
fn read_chunk<'t, T>(
    text: &'t str,
    read: &impl Fn(&'t str) -> Result<T, String>,
    stop: &AtomicBool,
    mut items: Vec<(usize, T)>,
) -> Chunk<T> {
    // Real lines are longer than 40 bytes: room from above.
    items.reserve(text.len() / 40);
    for (line, raw) in numbered_lines(text) {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        match read(raw) {
            Ok(item) => items.push((line, item)),
            Err(message) => {
                return Chunk {
                    items,
                    lines: 0,
                    error: Some((line, message)),
                }
            }
        }
    }
    Chunk {
        items,
        lines: memchr::memchr_iter(b'\n', text.as_bytes()).count(),
        error: None,
    }
}

/// Reads every non-blank line of `text` with `read` and gives each result
/// to `each` with the line's number (from 1, as [`numbered_lines`] numbers
/// them), in file order. Stops at the first line that does not read, after
/// giving `each` the lines before it, and returns its number and message.
pub(crate) fn read_in_order<'t, T: Send>(
    text: &'t str,
    read: impl Fn(&'t str) -> Result<T, String> + Sync,
    mut each: impl FnMut(usize, T),
) -> Result<(), (usize, String)> {
    if text.len() < TWO_THREADS_FROM {
        for (line, raw) in numbered_lines(text) {
            each(line, read(raw).map_err(|message| (line, message))?);
        }
        return Ok(());
    }
    let chunks = chunks(text);
    let n = chunks.len();
    // Handed-over chunks' emptied lists, for the next chunks to fill: fresh
    // ones would cost page faults again, the helper's from its own arena.
    let spare: Mutex<Vec<Vec<(usize, T)>>> = Mutex::new(Vec::new());
    let take_spare = || {
        let mut spare = spare.lock().unwrap_or_else(PoisonError::into_inner);
        spare.pop().unwrap_or_default()
    };
    let mut hand_over = |offset: usize, mut chunk: Chunk<T>| {
        for (line, item) in chunk.items.drain(..) {
            each(offset + line, item);
        }
        let mut spare = spare.lock().unwrap_or_else(PoisonError::into_inner);
        spare.push(chunk.items);
        match chunk.error {
            Some((line, message)) => Err((offset + line, message)),
            None => Ok(offset + chunk.lines),
        }
    };
    let next = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    let done: Mutex<Vec<Option<Chunk<T>>>> = Mutex::new((0..n).map(|_| None).collect());
    // Reads the next unclaimed chunk; false when none is left.
    let claim = || {
        let index = next.fetch_add(1, Ordering::Relaxed);
        if index >= n {
            return false;
        }
        let chunk = read_chunk(chunks[index], &read, &stop, take_spare());
        done.lock().unwrap_or_else(PoisonError::into_inner)[index] = Some(chunk);
        true
    };
    std::thread::scope(|scope| {
        // Without the helper (no thread to be had), this thread reads all.
        let _helper = std::thread::Builder::new()
            .name("dtr-read".into())
            .spawn_scoped(scope, || while !stop.load(Ordering::Relaxed) && claim() {});
        let mut offset = 0;
        let mut result = Ok(());
        for index in 0..n {
            let chunk = loop {
                let taken = done.lock().unwrap_or_else(PoisonError::into_inner)[index].take();
                if let Some(chunk) = taken {
                    break chunk;
                }
                if !claim() {
                    // All claimed, this one by the helper, still reading
                    // it: read it again here rather than wait for a thread
                    // that may have lost its core (its copy goes unused).
                    break read_chunk(chunks[index], &read, &stop, take_spare());
                }
            };
            match hand_over(offset, chunk) {
                Ok(lines) => offset = lines,
                Err(error) => {
                    result = Err(error);
                    break;
                }
            }
        }
        // The helper's work is done or unused: it stops at its next line,
        // so that leaving the scope (which joins it) waits for no chunk.
        stop.store(true, Ordering::Relaxed);
        result
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every line with its number, as one thread reads them.
    fn one_thread(text: &str) -> Vec<(usize, String)> {
        numbered_lines(text)
            .map(|(line, raw)| (line, raw.to_string()))
            .collect()
    }

    #[test]
    fn chunked_lines_come_in_order_with_their_numbers() {
        // Long enough for many chunks; blank lines and \r\n on the way.
        let mut text = String::new();
        for i in 0..20_000 {
            match i % 7 {
                0 => text.push('\n'),
                1 => text.push_str(&format!("line {i}\r\n")),
                _ => text.push_str(&format!("line {i} {}\n", "x".repeat(i % 50))),
            }
        }
        text.push_str("last line without a newline");
        assert!(text.len() >= TWO_THREADS_FROM && chunks(&text).len() > 16);
        assert_eq!(chunks(&text).concat(), text);
        let mut seen = Vec::new();
        read_in_order(
            &text,
            |raw| Ok(raw.to_string()),
            |line, raw| seen.push((line, raw)),
        )
        .unwrap();
        assert_eq!(seen, one_thread(&text));
    }

    #[test]
    fn the_first_line_that_fails_is_reported_after_those_before_it() {
        let text: String = (1..=100_000).map(|i| format!("{i}\n")).collect();
        assert!(text.len() >= TWO_THREADS_FROM);
        let mut seen = 0;
        let error = read_in_order(
            &text,
            |raw| match raw.parse::<usize>() {
                Ok(i) if i % 12_345 == 0 => Err(format!("{i} refused")),
                Ok(i) => Ok(i),
                Err(e) => Err(e.to_string()),
            },
            |line, i| {
                assert_eq!(line, i);
                seen += 1;
            },
        )
        .unwrap_err();
        assert_eq!(error, (12_345, "12345 refused".to_string()));
        assert_eq!(seen, 12_344);
    }
}

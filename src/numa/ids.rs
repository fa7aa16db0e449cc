//! Sets of CPU and node ids, and the kernel's list format they are read
//! from.
//!
//! An [`IdSet`] is a fixed bitset laid out as the kernel's bitmaps are, so
//! that the system calls (`linux`) pass it to the kernel as it is;
//! [`parse_cpulist`] reads the list format of sysfs files such as
//! `cpulist` and `online` (`0-3,8,10-11`) into one, a word at a time.

use std::fmt;

/// CPU and node ids at or above this are rejected as malformed: kernels
/// support at most 8192 CPUs and 1024 nodes. Lists parse into an
/// [`IdSet`] of this many bits (8 KiB), whatever their length.
pub(super) const MAX_ID: usize = 1 << 16;

/// Node ids the kernel supports (`MAX_NUMNODES` is at most `1 << 10`).
pub(super) const MAX_NODES: usize = 1 << 10;

/// Bits in one word of an [`IdSet`] (and of a kernel bitmap).
pub(super) const WORD_BITS: usize = libc::c_ulong::BITS as usize;

/// A set of CPU or node ids below [`MAX_ID`]: a fixed bitset laid out as
/// the kernel's bitmaps are (`unsigned long` words, id `i` in bit
/// `i % WORD_BITS` of word `i / WORD_BITS`), so that it goes to and comes
/// from `sched_setaffinity(2)`, `sched_getaffinity(2)` and `mbind(2)` as
/// it is.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct IdSet {
    /// The kernel's bitmap words (the system calls read and write them).
    pub(super) words: Box<[libc::c_ulong]>,
}

impl IdSet {
    /// The empty set.
    pub(crate) fn new() -> Self {
        Self {
            words: vec![0; MAX_ID / WORD_BITS].into_boxed_slice(),
        }
    }

    /// Adds the ids `first..=last` (both below [`MAX_ID`]), a word at a
    /// time.
    pub(super) fn insert_range(&mut self, first: usize, last: usize) {
        debug_assert!(first <= last && last < MAX_ID);
        let (first_word, last_word) = (first / WORD_BITS, last / WORD_BITS);
        for (index, word) in self.words[first_word..=last_word].iter_mut().enumerate() {
            let index = first_word + index;
            let low = if index == first_word {
                first % WORD_BITS
            } else {
                0
            };
            let high = if index == last_word {
                last % WORD_BITS
            } else {
                WORD_BITS - 1
            };
            *word |= (libc::c_ulong::MAX >> (WORD_BITS - 1 - high)) & (libc::c_ulong::MAX << low);
        }
    }

    /// Adds `id`; `false` (and nothing added) if it is [`MAX_ID`] or more.
    pub(crate) fn insert(&mut self, id: usize) -> bool {
        if id >= MAX_ID {
            return false;
        }
        self.insert_range(id, id);
        true
    }

    /// Whether `id` is in the set.
    pub(crate) fn contains(&self, id: usize) -> bool {
        id < MAX_ID && self.words[id / WORD_BITS] & (1 << (id % WORD_BITS)) != 0
    }

    /// How many ids the set holds.
    #[cfg_attr(not(test), allow(dead_code))] // tests and diagnostics
    pub(crate) fn len(&self) -> usize {
        self.words.iter().map(|w| w.count_ones() as usize).sum()
    }

    /// Whether the set is empty.
    pub(crate) fn is_empty(&self) -> bool {
        self.words.iter().all(|&w| w == 0)
    }

    /// The ids, ascending.
    pub(crate) fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        self.words.iter().enumerate().flat_map(|(index, &word)| {
            let mut rest = word;
            std::iter::from_fn(move || {
                if rest == 0 {
                    return None;
                }
                let bit = rest.trailing_zeros() as usize;
                rest &= rest - 1;
                Some(index * WORD_BITS + bit)
            })
        })
    }

    /// The ids, ascending, in a vector.
    #[cfg_attr(not(test), allow(dead_code))] // tests and diagnostics
    pub(crate) fn to_vec(&self) -> Vec<usize> {
        self.iter().collect()
    }

    /// The ids in both sets.
    pub(crate) fn intersection(&self, other: &Self) -> Self {
        Self {
            words: self
                .words
                .iter()
                .zip(other.words.iter())
                .map(|(a, b)| a & b)
                .collect(),
        }
    }

    /// The words up to the last one with an id in it (none for the empty
    /// set): what a system call that takes a bitmap needs to read.
    pub(super) fn used_words(&self) -> &[libc::c_ulong] {
        let used = self
            .words
            .iter()
            .rposition(|&w| w != 0)
            .map_or(0, |i| i + 1);
        &self.words[..used]
    }
}

impl fmt::Debug for IdSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.iter()).finish()
    }
}

impl FromIterator<usize> for IdSet {
    /// The ids below [`MAX_ID`] among `ids` (others are left out).
    fn from_iter<I: IntoIterator<Item = usize>>(ids: I) -> Self {
        let mut set = Self::new();
        for id in ids {
            set.insert(id);
        }
        set
    }
}

// === the list format ===

/// Parses the kernel's list format (`cpulist`, a node's `online`):
/// comma-separated ids and inclusive ranges such as `0-3,8,10-11`, with
/// whitespace around items and a trailing newline allowed. An empty list
/// (a node without CPUs) is valid. Any other text (a stray character, an
/// empty item, a reversed or open range, an id of [`MAX_ID`] or more) is an
/// error naming the item. Ranges go into a fixed bitset a word at a time,
/// so time and memory stay small for any list a sysfs read returns,
/// however its ranges overlap.
pub(super) fn parse_cpulist(text: &str) -> Result<IdSet, String> {
    let text = text.trim();
    let mut ids = IdSet::new();
    if text.is_empty() {
        return Ok(ids);
    }
    for item in text.split(',').map(str::trim) {
        let (first, last) = match item.split_once('-') {
            Some((first, last)) => (parse_id(first, item)?, parse_id(last, item)?),
            None => {
                let id = parse_id(item, item)?;
                (id, id)
            }
        };
        if first > last {
            return Err(format!("reversed range `{item}`"));
        }
        ids.insert_range(first, last);
    }
    Ok(ids)
}

/// One id of a list item: decimal digits only, below [`MAX_ID`].
fn parse_id(digits: &str, item: &str) -> Result<usize, String> {
    let digits = digits.trim();
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("bad item `{item}`"));
    }
    digits
        .parse::<usize>()
        .ok()
        .filter(|&id| id < MAX_ID)
        .ok_or_else(|| format!("id out of range in `{item}`"))
}

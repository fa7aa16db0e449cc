//! The trace file's format (see the parent module): records as words, and
//! reading a file back.

use std::fmt;
use std::io::Read;
use std::path::Path;

/// The first eight bytes of a trace.
pub const MAGIC: [u8; 8] = *b"PINPOOLT";

/// The format version this crate writes; it reads this one and every
/// earlier one (version 1 lacks the unregistration record).
pub const VERSION: u32 = 2;

/// The longest header a reader accepts.
const MAX_HEADER: u32 = 1 << 20;

/// Bytes per record.
pub(crate) const RECORD_BYTES: usize = 48;

/// Bytes before the header text.
const PREAMBLE: usize = 16;

pub(crate) const TAKE: u8 = 1;
pub(crate) const DROP: u8 = 2;
pub(crate) const REGISTER: u8 = 3;
pub(crate) const EVICT: u8 = 4;
pub(crate) const TRIM: u8 = 5;
pub(crate) const FLUSH: u8 = 6;
pub(crate) const LOST: u8 = 7;
pub(crate) const OUTSTANDING: u8 = 8;
pub(crate) const END: u8 = 9;
pub(crate) const UNREGISTER: u8 = 10;

/// Drop flags.
pub(crate) const DROP_COPY: u8 = 1;
pub(crate) const DROP_PINNED: u8 = 2;
pub(crate) const DROP_REMOTE: u8 = 4;
/// Registration (and unregistration) flags.
pub(crate) const REGISTER_FAILED: u8 = 1;
pub(crate) const REGISTER_REGION: u8 = 2;

/// Where a take's buffer came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Source {
    /// A ready buffer of the calling thread's cache.
    Ready,
    /// A buffer the calling thread dropped earlier, re-zeroed by the take.
    Deferred,
    /// The device's shared stacks.
    Shard,
    /// An idle buffer of a larger class (its length is the class asked).
    Borrowed,
    /// Another thread's cache.
    Stolen,
    /// Carved from a region's free space.
    Carved,
    /// Nothing pooled: a fresh pageable buffer.
    Miss,
}

impl Source {
    /// Whether the pool served the take (anything but a miss).
    pub fn is_hit(self) -> bool {
        self != Source::Miss
    }

    /// The name [`Record`]'s text form uses.
    pub fn name(self) -> &'static str {
        match self {
            Source::Ready => "ready",
            Source::Deferred => "deferred",
            Source::Shard => "shard",
            Source::Borrowed => "borrowed",
            Source::Stolen => "stolen",
            Source::Carved => "carved",
            Source::Miss => "miss",
        }
    }

    pub(crate) fn code(self) -> u8 {
        match self {
            Source::Ready => 0,
            Source::Deferred => 1,
            Source::Shard => 2,
            Source::Borrowed => 3,
            Source::Stolen => 4,
            Source::Carved => 5,
            Source::Miss => 6,
        }
    }

    fn from_code(code: u8) -> Option<Self> {
        Some(match code {
            0 => Source::Ready,
            1 => Source::Deferred,
            2 => Source::Shard,
            3 => Source::Borrowed,
            4 => Source::Stolen,
            5 => Source::Carved,
            6 => Source::Miss,
            _ => return None,
        })
    }
}

/// One record of a trace; times are nanoseconds since the trace began.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Record {
    /// A take.
    Take {
        /// When.
        time_ns: u64,
        /// The taking thread.
        thread: u64,
        /// The device.
        device: u16,
        /// The buffer's address.
        id: u64,
        /// Bytes asked.
        asked: u64,
        /// The length handed out (the size class).
        len: u64,
        /// Where the buffer came from.
        source: Source,
    },
    /// A drop.
    Drop {
        /// When.
        time_ns: u64,
        /// The dropping thread.
        thread: u64,
        /// The thread that took the buffer.
        taker: u64,
        /// The device.
        device: u16,
        /// The buffer's address.
        id: u64,
        /// Bytes written: the dirty prefix as `set_dirty_len` or the
        /// copies made through cudarc left it.
        dirty: u64,
        /// Whether a copy was recorded (a fence the cleaner waits for).
        copy_recorded: bool,
        /// Whether the buffer was page-locked.
        pinned: bool,
        /// Whether a thread other than the taker's dropped it.
        remote: bool,
    },
    /// A registration (page-locking) by the cleaner.
    Register {
        /// When it ended.
        time_ns: u64,
        /// The device.
        device: u16,
        /// The address registered.
        id: u64,
        /// Bytes.
        bytes: u64,
        /// How long it took.
        took_ns: u64,
        /// Whether it failed.
        failed: bool,
        /// Whether a region (carved into buffers) was registered, not a
        /// buffer.
        region: bool,
    },
    /// An unregistration by the pool: of a region (idle-trimmed, over the
    /// cap, drained, folded into a larger one, cleared, or at shutdown) or
    /// of a buffer or slab released; with the registrations, what it
    /// holds pinned at any time up to the trace's end (a pool that never
    /// closes, as the global pool, finishes its trace at the process's
    /// exit while its cleaner may still release memory: not recorded).
    Unregister {
        /// When it ended.
        time_ns: u64,
        /// The device.
        device: u16,
        /// The address unregistered.
        id: u64,
        /// Bytes.
        bytes: u64,
        /// How long it took.
        took_ns: u64,
        /// Whether it failed (the memory is leaked, still pinned).
        failed: bool,
        /// Whether a region was unregistered, not a buffer or a slab.
        region: bool,
    },
    /// Buffers evicted to keep the pooled bytes under the cap.
    Evict {
        /// When.
        time_ns: u64,
        /// Bytes.
        bytes: u64,
        /// Buffers.
        buffers: u64,
    },
    /// Idle buffers trimmed.
    Trim {
        /// When.
        time_ns: u64,
        /// Bytes.
        bytes: u64,
        /// Buffers.
        buffers: u64,
    },
    /// A `flush`.
    Flush {
        /// When it returned.
        time_ns: u64,
        /// How long it took.
        took_ns: u64,
    },
    /// Records a thread's full buffer dropped since its last such record.
    Lost {
        /// When the background thread found them lost.
        time_ns: u64,
        /// The thread; 0 for the pool's shared buffer (which several
        /// threads write: the orphaned caches' takes and drops, the
        /// pool's own events). When a thread inherits another's buffer
        /// (its cache) and both lose records before the background
        /// thread's next pass, each gets a record of its own (a third
        /// thread within the same pass is counted with the second).
        thread: u64,
        /// How many.
        records: u64,
    },
    /// A buffer taken and not dropped while the pool lived.
    Outstanding {
        /// When it was taken.
        time_ns: u64,
        /// The taking thread.
        thread: u64,
        /// The device.
        device: u16,
        /// The buffer's address.
        id: u64,
        /// Bytes asked.
        asked: u64,
        /// The length handed out.
        len: u64,
    },
    /// The last record.
    End {
        /// When the pool closed.
        time_ns: u64,
        /// Records written before this one.
        records: u64,
        /// Records lost in all.
        lost: u64,
    },
}

/// `bit` if `on`.
fn flag(on: bool, bit: u8) -> u8 {
    if on {
        bit
    } else {
        0
    }
}

/// Packs the first word.
pub(crate) fn head(kind: u8, flags: u8, device: u16) -> u64 {
    u64::from(kind) | u64::from(flags) << 8 | u64::from(device) << 16
}

impl Record {
    /// When, nanoseconds since the trace began.
    pub fn time_ns(&self) -> u64 {
        match *self {
            Record::Take { time_ns, .. }
            | Record::Drop { time_ns, .. }
            | Record::Register { time_ns, .. }
            | Record::Unregister { time_ns, .. }
            | Record::Evict { time_ns, .. }
            | Record::Trim { time_ns, .. }
            | Record::Flush { time_ns, .. }
            | Record::Lost { time_ns, .. }
            | Record::Outstanding { time_ns, .. }
            | Record::End { time_ns, .. } => time_ns,
        }
    }

    /// The record's six words, as written.
    pub(crate) fn to_words(self) -> [u64; 6] {
        match self {
            Record::Take {
                time_ns,
                thread,
                device,
                id,
                asked,
                len,
                source,
            } => [
                head(TAKE, source.code(), device),
                time_ns,
                thread,
                id,
                asked,
                len,
            ],
            Record::Drop {
                time_ns,
                thread,
                taker,
                device,
                id,
                dirty,
                copy_recorded,
                pinned,
                remote,
            } => {
                let flags = flag(copy_recorded, DROP_COPY)
                    | flag(pinned, DROP_PINNED)
                    | flag(remote, DROP_REMOTE);
                [head(DROP, flags, device), time_ns, thread, id, dirty, taker]
            }
            Record::Register {
                time_ns,
                device,
                id,
                bytes,
                took_ns,
                failed,
                region,
            } => registration_words(
                REGISTER, time_ns, device, id, bytes, took_ns, failed, region,
            ),
            Record::Unregister {
                time_ns,
                device,
                id,
                bytes,
                took_ns,
                failed,
                region,
            } => registration_words(
                UNREGISTER, time_ns, device, id, bytes, took_ns, failed, region,
            ),
            Record::Evict {
                time_ns,
                bytes,
                buffers,
            } => [head(EVICT, 0, 0), time_ns, 0, 0, bytes, buffers],
            Record::Trim {
                time_ns,
                bytes,
                buffers,
            } => [head(TRIM, 0, 0), time_ns, 0, 0, bytes, buffers],
            Record::Flush { time_ns, took_ns } => [head(FLUSH, 0, 0), time_ns, 0, 0, took_ns, 0],
            Record::Lost {
                time_ns,
                thread,
                records,
            } => [head(LOST, 0, 0), time_ns, thread, 0, records, 0],
            Record::Outstanding {
                time_ns,
                thread,
                device,
                id,
                asked,
                len,
            } => [
                head(OUTSTANDING, 0, device),
                time_ns,
                thread,
                id,
                asked,
                len,
            ],
            Record::End {
                time_ns,
                records,
                lost,
            } => [head(END, 0, 0), time_ns, 0, 0, records, lost],
        }
    }

    /// The record of six words, or what is wrong with them.
    pub(crate) fn from_words(w: [u64; 6]) -> Result<Self, String> {
        let record = Self::decode(w)?;
        // A word or field the record's kind does not use is zero: every
        // record reads back into the bytes it was read from.
        if record.to_words() != w {
            return Err(format!(
                "a field a record of kind {} does not use is not zero",
                w[0] as u8
            ));
        }
        Ok(record)
    }

    fn decode(w: [u64; 6]) -> Result<Self, String> {
        let kind = w[0] as u8;
        let flags = (w[0] >> 8) as u8;
        let device = (w[0] >> 16) as u16;
        if w[0] >> 32 != 0 {
            return Err(format!("reserved bytes are not zero ({:#x})", w[0] >> 32));
        }
        let [_, time_ns, thread, id, a, b] = w;
        let no_flags = |record: Record| {
            if flags != 0 {
                Err(format!("flags {flags:#x} on a record of kind {kind}"))
            } else {
                Ok(record)
            }
        };
        match kind {
            TAKE => {
                let source = Source::from_code(flags)
                    .ok_or_else(|| format!("unknown take source {flags}"))?;
                Ok(Record::Take {
                    time_ns,
                    thread,
                    device,
                    id,
                    asked: a,
                    len: b,
                    source,
                })
            }
            DROP => {
                if flags & !(DROP_COPY | DROP_PINNED | DROP_REMOTE) != 0 {
                    return Err(format!("unknown drop flags {flags:#x}"));
                }
                Ok(Record::Drop {
                    time_ns,
                    thread,
                    taker: b,
                    device,
                    id,
                    dirty: a,
                    copy_recorded: flags & DROP_COPY != 0,
                    pinned: flags & DROP_PINNED != 0,
                    remote: flags & DROP_REMOTE != 0,
                })
            }
            REGISTER | UNREGISTER => {
                if flags & !(REGISTER_FAILED | REGISTER_REGION) != 0 {
                    return Err(format!("unknown (un)registration flags {flags:#x}"));
                }
                let (failed, region) = (flags & REGISTER_FAILED != 0, flags & REGISTER_REGION != 0);
                let (bytes, took_ns) = (a, b);
                Ok(if kind == REGISTER {
                    Record::Register {
                        time_ns,
                        device,
                        id,
                        bytes,
                        took_ns,
                        failed,
                        region,
                    }
                } else {
                    Record::Unregister {
                        time_ns,
                        device,
                        id,
                        bytes,
                        took_ns,
                        failed,
                        region,
                    }
                })
            }
            EVICT => no_flags(Record::Evict {
                time_ns,
                bytes: a,
                buffers: b,
            }),
            TRIM => no_flags(Record::Trim {
                time_ns,
                bytes: a,
                buffers: b,
            }),
            FLUSH => no_flags(Record::Flush {
                time_ns,
                took_ns: a,
            }),
            LOST => no_flags(Record::Lost {
                time_ns,
                thread,
                records: a,
            }),
            OUTSTANDING => no_flags(Record::Outstanding {
                time_ns,
                thread,
                device,
                id,
                asked: a,
                len: b,
            }),
            END => no_flags(Record::End {
                time_ns,
                records: a,
                lost: b,
            }),
            other => Err(format!("unknown record kind {other}")),
        }
    }

    /// The record's 48 bytes.
    pub(crate) fn to_bytes(self) -> [u8; RECORD_BYTES] {
        words_to_bytes(self.to_words())
    }
}

/// A registration's or an unregistration's words.
#[allow(clippy::too_many_arguments)]
fn registration_words(
    kind: u8,
    time_ns: u64,
    device: u16,
    id: u64,
    bytes: u64,
    took_ns: u64,
    failed: bool,
    region: bool,
) -> [u64; 6] {
    let flags = flag(failed, REGISTER_FAILED) | flag(region, REGISTER_REGION);
    [head(kind, flags, device), time_ns, 0, id, bytes, took_ns]
}

/// Nanoseconds as microseconds, to the nanosecond (exact at any size: a
/// float loses nanoseconds past about 2^53).
fn us(ns: u64) -> String {
    format!("{}.{:03}", ns / 1000, ns % 1000)
}

/// A registration's or an unregistration's fields as text: device,
/// address, bytes, time taken, failed, region.
struct Registration(u16, u64, u64, u64, bool, bool);

impl fmt::Display for Registration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Self(device, id, bytes, took_ns, failed, region) = *self;
        write!(
            f,
            "device={device} address={id:#x} bytes={bytes} took_us={} failed={failed} region={region}",
            us(took_ns)
        )
    }
}

/// Six words as 48 little-endian bytes.
pub(crate) fn words_to_bytes(words: [u64; 6]) -> [u8; RECORD_BYTES] {
    let mut out = [0; RECORD_BYTES];
    for (chunk, word) in out.chunks_exact_mut(8).zip(words) {
        chunk.copy_from_slice(&word.to_le_bytes());
    }
    out
}

impl fmt::Display for Record {
    /// One line: the time in microseconds, the kind, then `key=value`
    /// fields (`trace-dump`'s text).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Record::Take {
                time_ns,
                thread,
                device,
                id,
                asked,
                len,
                source,
            } => write!(
                f,
                "{} take thread={thread} device={device} buffer={id:#x} asked={asked} len={len} source={}",
                us(time_ns),
                source.name()
            ),
            Record::Drop {
                time_ns,
                thread,
                taker,
                device,
                id,
                dirty,
                copy_recorded,
                pinned,
                remote,
            } => write!(
                f,
                "{} drop thread={thread} device={device} buffer={id:#x} dirty={dirty} copy={copy_recorded} pinned={pinned} remote={remote} taker={taker}",
                us(time_ns)
            ),
            Record::Register {
                time_ns,
                device,
                id,
                bytes,
                took_ns,
                failed,
                region,
            } => write!(
                f,
                "{} register {}",
                us(time_ns),
                Registration(device, id, bytes, took_ns, failed, region)
            ),
            Record::Unregister {
                time_ns,
                device,
                id,
                bytes,
                took_ns,
                failed,
                region,
            } => write!(
                f,
                "{} unregister {}",
                us(time_ns),
                Registration(device, id, bytes, took_ns, failed, region)
            ),
            Record::Evict {
                time_ns,
                bytes,
                buffers,
            } => write!(f, "{} evict bytes={bytes} buffers={buffers}", us(time_ns)),
            Record::Trim {
                time_ns,
                bytes,
                buffers,
            } => write!(f, "{} trim bytes={bytes} buffers={buffers}", us(time_ns)),
            Record::Flush { time_ns, took_ns } => {
                write!(f, "{} flush took_us={}", us(time_ns), us(took_ns))
            }
            Record::Lost {
                time_ns,
                thread,
                records,
            } => write!(f, "{} lost thread={thread} records={records}", us(time_ns)),
            Record::Outstanding {
                time_ns,
                thread,
                device,
                id,
                asked,
                len,
            } => write!(
                f,
                "{} outstanding thread={thread} device={device} buffer={id:#x} asked={asked} len={len}",
                us(time_ns)
            ),
            Record::End {
                time_ns,
                records,
                lost,
            } => write!(f, "{} end records={records} lost={lost}", us(time_ns)),
        }
    }
}

/// A trace's header: its `key=value` lines, in order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Header {
    /// The lines, split at their first `=`.
    pub entries: Vec<(String, String)>,
}

impl Header {
    /// The value of the first line with `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.entries
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// The pool's settings (the `setting.` lines) as a `PINPOOL_CONF`
    /// text, for [`PoolBuilder::try_conf`](crate::PoolBuilder::try_conf).
    pub fn conf(&self) -> String {
        self.entries
            .iter()
            .filter_map(|(k, v)| k.strip_prefix("setting.").map(|k| format!("{k}={v}")))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The header's bytes in the file (after the preamble).
    pub(crate) fn to_text(&self) -> String {
        self.entries
            .iter()
            .map(|(k, v)| format!("{k}={v}\n"))
            .collect()
    }

    fn parse(text: &str, offset: u64) -> Result<Self, ParseError> {
        let mut entries = Vec::new();
        let mut at = offset;
        // Every line is `key=value` and ends with a newline (as a pool
        // writes them), so a header reads back into its own bytes.
        for line in text.split_inclusive('\n') {
            let body = line.strip_suffix('\n').ok_or_else(|| {
                ParseError::new(at, "the header's last line does not end with a newline")
            })?;
            let (k, v) = body.split_once('=').ok_or_else(|| {
                ParseError::new(at, format!("header line `{body}` is not key=value"))
            })?;
            entries.push((k.to_string(), v.to_string()));
            at += line.len() as u64;
        }
        Ok(Self { entries })
    }
}

/// What is wrong with a trace, and where.
#[derive(Debug)]
pub struct ParseError {
    /// The byte offset in the file where the problem starts.
    pub offset: u64,
    /// What is wrong.
    pub reason: String,
    /// The I/O error, if reading failed.
    pub io: Option<std::io::Error>,
}

impl ParseError {
    fn new(offset: u64, reason: impl Into<String>) -> Self {
        Self {
            offset,
            reason: reason.into(),
            io: None,
        }
    }
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "bad trace at byte {}: {}", self.offset, self.reason)
    }
}

impl std::error::Error for ParseError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.io
            .as_ref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

/// Reads a trace record by record: [`header`](Self::header), then the
/// records as an iterator, which ends after the end record, or with one
/// error (a truncated or corrupt record, a file without its end record,
/// data after it).
///
/// # Examples
///
/// ```
/// let bytes = b"PINPOOLT\x03\0\0\0\0\0\0\0";
/// let err = pinpool::trace::Reader::new(&bytes[..]).unwrap_err();
/// assert_eq!(err.offset, 8);
/// assert!(err.to_string().contains("version 3"));
/// ```
#[derive(Debug)]
pub struct Reader<R> {
    input: R,
    header: Header,
    offset: u64,
    ended: bool,
    failed: bool,
    records: u64,
    /// The file's format version.
    version: u32,
}

/// Reads up to `buf.len()` bytes; the count read (short only at the end).
fn read_full(input: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match input.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

fn io_error(offset: u64, e: std::io::Error) -> ParseError {
    ParseError {
        offset,
        reason: format!("could not read: {e}"),
        io: Some(e),
    }
}

impl<R: Read> Reader<R> {
    /// Reads the preamble and the header.
    pub fn new(mut input: R) -> Result<Self, ParseError> {
        let mut pre = [0u8; PREAMBLE];
        let got = read_full(&mut input, &mut pre).map_err(|e| io_error(0, e))?;
        if got < MAGIC.len() || pre[..MAGIC.len()] != MAGIC {
            let found = &pre[..got.min(MAGIC.len())];
            return Err(ParseError::new(
                0,
                format!("not a pinpool trace (starts {found:?}, not PINPOOLT)"),
            ));
        }
        if got < PREAMBLE {
            return Err(ParseError::new(
                got as u64,
                "truncated in the preamble".to_string(),
            ));
        }
        let version = u32::from_le_bytes(pre[8..12].try_into().expect("4 bytes"));
        if !(1..=VERSION).contains(&version) {
            return Err(ParseError::new(
                8,
                format!("version {version}, this reader reads versions 1 to {VERSION}"),
            ));
        }
        let len = u32::from_le_bytes(pre[12..16].try_into().expect("4 bytes"));
        if len > MAX_HEADER {
            return Err(ParseError::new(
                12,
                format!("a header of {len} bytes (at most {MAX_HEADER})"),
            ));
        }
        let mut text = vec![0u8; len as usize];
        let got = read_full(&mut input, &mut text).map_err(|e| io_error(PREAMBLE as u64, e))?;
        if got < text.len() {
            return Err(ParseError::new(
                (PREAMBLE + got) as u64,
                format!("truncated in the header ({got} of {len} bytes)"),
            ));
        }
        let text = String::from_utf8(text).map_err(|e| {
            ParseError::new(
                (PREAMBLE + e.utf8_error().valid_up_to()) as u64,
                "the header is not UTF-8",
            )
        })?;
        let header = Header::parse(&text, PREAMBLE as u64)?;
        Ok(Self {
            input,
            header,
            offset: (PREAMBLE + len as usize) as u64,
            ended: false,
            failed: false,
            records: 0,
            version,
        })
    }

    /// The header.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// The format version the file was written in.
    pub fn version(&self) -> u32 {
        self.version
    }

    fn next_record(&mut self) -> Result<Option<Record>, ParseError> {
        let mut buf = [0u8; RECORD_BYTES];
        let at = self.offset;
        let got = read_full(&mut self.input, &mut buf).map_err(|e| io_error(at, e))?;
        if self.ended {
            return if got == 0 {
                Ok(None)
            } else {
                Err(ParseError::new(at, "data after the end record"))
            };
        }
        if got == 0 {
            return Err(ParseError::new(
                at,
                "ends without an end record (the pool did not close, or the file was cut)",
            ));
        }
        if got < RECORD_BYTES {
            return Err(ParseError::new(
                at,
                format!("truncated record ({got} of {RECORD_BYTES} bytes)"),
            ));
        }
        let mut words = [0u64; 6];
        for (word, chunk) in words.iter_mut().zip(buf.chunks_exact(8)) {
            *word = u64::from_le_bytes(chunk.try_into().expect("8 bytes"));
        }
        let record = Record::from_words(words).map_err(|why| ParseError::new(at, why))?;
        if self.version < 2 && matches!(record, Record::Unregister { .. }) {
            return Err(ParseError::new(
                at,
                "an unregistration record in a version 1 trace",
            ));
        }
        if let Record::End { records, .. } = record {
            if records != self.records {
                return Err(ParseError::new(
                    at,
                    format!(
                        "the end record counts {records} records, the file has {}",
                        self.records
                    ),
                ));
            }
            self.ended = true;
        }
        self.records += 1;
        self.offset += RECORD_BYTES as u64;
        Ok(Some(record))
    }
}

impl<R: Read> Iterator for Reader<R> {
    type Item = Result<Record, ParseError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        match self.next_record() {
            Ok(Some(record)) => Some(Ok(record)),
            Ok(None) => None,
            Err(e) => {
                self.failed = true;
                Some(Err(e))
            }
        }
    }
}

/// A whole trace, read into memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trace {
    /// The format version the file was written in (see [`VERSION`]).
    pub version: u32,
    /// The header.
    pub header: Header,
    /// The records in file order, the end record last.
    pub records: Vec<Record>,
}

impl Trace {
    /// Reads the trace at `path`.
    pub fn read(path: impl AsRef<Path>) -> Result<Self, ParseError> {
        let file = std::fs::File::open(path.as_ref()).map_err(|e| io_error(0, e))?;
        Self::from_reader(std::io::BufReader::new(file))
    }

    /// Reads a trace from `input`.
    pub fn from_reader(input: impl Read) -> Result<Self, ParseError> {
        let mut reader = Reader::new(input)?;
        let mut records = Vec::new();
        for record in &mut reader {
            records.push(record?);
        }
        Ok(Self {
            version: reader.version,
            header: reader.header,
            records,
        })
    }

    /// Reads the trace at `path` as far as it is good: its header (an
    /// error if that is bad), every record up to the first bad one, and
    /// the error that stopped the reading, if any: a trace whose pool never
    /// closed (no end record) or a file cut short still gives the records
    /// before the cut.
    ///
    /// # Examples
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let path = std::env::temp_dir().join(format!("pinpool-doc-partial-{}.trace", std::process::id()));
    /// let pool = pinpool::Pool::builder()
    ///     .backend(pinpool::BackendKind::Host)
    ///     .trace(&path)
    ///     .build()?;
    /// drop(pool.take(4096));
    /// drop(pool);
    /// let whole = std::fs::read(&path)?;
    /// std::fs::write(&path, &whole[..whole.len() - 48])?; // the end record cut off
    /// let (trace, error) = pinpool::trace::Trace::read_partial(&path)?;
    /// assert!(error.is_some());
    /// assert!(trace.records.iter().any(|r| matches!(r, pinpool::trace::Record::Take { .. })));
    /// # std::fs::remove_file(&path)?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn read_partial(path: impl AsRef<Path>) -> Result<(Self, Option<ParseError>), ParseError> {
        let file = std::fs::File::open(path.as_ref()).map_err(|e| io_error(0, e))?;
        Self::from_reader_partial(std::io::BufReader::new(file))
    }

    /// As [`Trace::read_partial`], from `input`.
    pub fn from_reader_partial(input: impl Read) -> Result<(Self, Option<ParseError>), ParseError> {
        let mut reader = Reader::new(input)?;
        let mut records = Vec::new();
        let mut error = None;
        for record in &mut reader {
            match record {
                Ok(record) => records.push(record),
                Err(e) => {
                    error = Some(e);
                    break;
                }
            }
        }
        Ok((
            Self {
                version: reader.version,
                header: reader.header,
                records,
            },
            error,
        ))
    }

    /// The trace's bytes (its version, the header, the records as they
    /// are): what the pool would have written.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = preamble(self.version, &self.header);
        for record in &self.records {
            out.extend_from_slice(&record.to_bytes());
        }
        out
    }
}

/// The magic, `version` and the header.
pub(crate) fn preamble(version: u32, header: &Header) -> Vec<u8> {
    let text = header.to_text();
    let mut out = Vec::with_capacity(PREAMBLE + text.len());
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&version.to_le_bytes());
    out.extend_from_slice(&(text.len() as u32).to_le_bytes());
    out.extend_from_slice(text.as_bytes());
    out
}

//! Lets tonic serve gRPC clients that send a unix socket path as the HTTP/2
//! `:authority`.
//!
//! kubelet's plugin-registration client (and any grpc-go, grpc-java or
//! grpc-python client that dials a unix socket by its path) sends the socket
//! path, e.g. `/var/lib/kubelet/plugins_registry/x-reg.sock`, as
//! `:authority`. The `h2` crate under tonic rejects that as a malformed
//! authority and resets the stream with PROTOCOL_ERROR, so such a client can
//! never call us. Nothing on a unix socket cares about the authority, so this
//! module sits between an accepted connection and tonic and rewrites it:
//!
//! - the client's connection preface and every frame other than HEADERS and
//!   CONTINUATION pass through byte for byte, as does everything the server
//!   writes;
//! - each client header block (HEADERS plus its CONTINUATIONs) is decoded
//!   with an HPACK decoder that lives as long as the connection (so it follows
//!   the client's dynamic table and its size updates), `:authority` is
//!   replaced by `localhost` (a block without one gets none), and the block is
//!   re-encoded without the dynamic table: static-table indexes or literals
//!   that are never indexed. The server's decoder therefore never holds state
//!   that the client's encoder does not know about, and since nothing is
//!   indexed, "never indexed" keeps any field the client marked sensitive as
//!   sensitive (RFC 7541 §7.1.3) without having to know which it was;
//! - the new block goes out as HEADERS (keeping END_STREAM and the PRIORITY
//!   fields, dropping padding) plus CONTINUATIONs, each within the 16384-byte
//!   frame size every HTTP/2 peer accepts.
//!
//! The bytes come from an untrusted peer: nothing here panics on them, buffers
//! are bounded ([`MAX_HEADER_BLOCK`], [`MAX_HEADER_LIST`], [`MAX_TABLE_SIZE`]),
//! and a violation ends the connection with an error on the server's read side
//! (hyper then closes it).
//!
//! [`Rewriter`] is the sans-IO core; [`LocalhostAuthority`] wraps an IO object
//! with it; [`incoming`] turns a [`UnixListener`] into the connection stream
//! that `tonic::transport::Server::serve_with_incoming` takes.

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use loona_hpack::Decoder;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{UnixListener, UnixStream};
use tokio_stream::wrappers::UnixListenerStream;
use tokio_stream::{Stream, StreamExt};
use tonic::transport::server::Connected;

/// What `:authority` becomes.
pub const AUTHORITY: &[u8] = b"localhost";

/// Largest header block (the fragments of HEADERS plus CONTINUATIONs,
/// padding included) accepted. hyper's server takes header lists of at most
/// 16 KiB decoded, and HPACK never makes a block much larger than its list.
pub const MAX_HEADER_BLOCK: usize = 64 * 1024;
/// Largest decoded header list accepted, counted as HPACK does (name + value
/// + 32 per field). Bounds what a tiny block of references into the dynamic
///   table can expand to.
pub const MAX_HEADER_LIST: usize = 64 * 1024;
/// Largest dynamic table a client may ask for. The server advertises the
/// default 4096, so a client that stays within what it was told never comes
/// near this; the bound only caps memory.
pub const MAX_TABLE_SIZE: usize = 64 * 1024;

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const FRAME_HEAD: usize = 9;
/// SETTINGS_MAX_FRAME_SIZE's initial value: every peer accepts frames this big.
const MAX_FRAME: usize = 16384;
const PRIORITY_LEN: usize = 5;

const HEADERS: u8 = 0x1;
const PUSH_PROMISE: u8 = 0x5;
const CONTINUATION: u8 = 0x9;

const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;

/// Why a connection was ended.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AuthorityError {
    #[error("header block of stream {stream} exceeds {MAX_HEADER_BLOCK} bytes")]
    BlockTooLarge { stream: u32 },
    #[error("decoded header list of stream {stream} exceeds {MAX_HEADER_LIST} bytes")]
    ListTooLarge { stream: u32 },
    #[error("HEADERS frame of stream {stream}: padding exceeds the payload")]
    BadPadding { stream: u32 },
    #[error("HEADERS frame of stream {stream}: too short for its PRIORITY fields")]
    ShortPriority { stream: u32 },
    #[error(
        "expected CONTINUATION of stream {expected}, got frame type {kind:#x} on stream {stream}"
    )]
    ExpectedContinuation {
        expected: u32,
        kind: u8,
        stream: u32,
    },
    #[error("CONTINUATION frame on stream {stream} without a header block in progress")]
    UnexpectedContinuation { stream: u32 },
    #[error("a client must not send PUSH_PROMISE")]
    PushPromise,
    #[error("HPACK decoding of stream {stream}'s header block: {reason}")]
    Hpack { stream: u32, reason: String },
}

impl From<AuthorityError> for io::Error {
    fn from(e: AuthorityError) -> Self {
        io::Error::new(io::ErrorKind::InvalidData, e)
    }
}

/// A frame header.
#[derive(Clone, Copy, Debug)]
struct FrameHead {
    len: usize,
    kind: u8,
    flags: u8,
    /// Without the reserved bit, which receivers ignore.
    stream: u32,
}

impl FrameHead {
    fn parse(b: &[u8; FRAME_HEAD]) -> Self {
        Self {
            len: usize::from(b[0]) << 16 | usize::from(b[1]) << 8 | usize::from(b[2]),
            kind: b[3],
            flags: b[4],
            stream: u32::from_be_bytes([b[5], b[6], b[7], b[8]]) & 0x7fff_ffff,
        }
    }
}

/// Where the reader is in the client's byte stream.
enum State {
    /// Matching the connection preface; `usize` bytes matched so far.
    Preface(usize),
    /// Not HTTP/2 with prior knowledge: everything is forwarded and the server
    /// rejects it in its own words.
    Passthrough,
    /// Reading a frame header.
    Head([u8; FRAME_HEAD], usize),
    /// Forwarding this many more payload bytes of an untouched frame.
    Forward(usize),
    /// Collecting the payload of a HEADERS or CONTINUATION frame.
    Collect(FrameHead, Vec<u8>),
    Failed(AuthorityError),
}

/// A header block being collected.
struct Block {
    stream: u32,
    end_stream: bool,
    priority: Option<[u8; PRIORITY_LEN]>,
    fragment: Vec<u8>,
}

/// The client → server half of the rewriting, without IO: feed it what the
/// client sent, it appends what the server should read.
pub struct Rewriter {
    state: State,
    decoder: Decoder<'static>,
    block: Option<Block>,
}

impl Default for Rewriter {
    fn default() -> Self {
        Self::new()
    }
}

impl Rewriter {
    pub fn new() -> Self {
        let mut decoder = Decoder::new();
        decoder.set_max_allowed_table_size(MAX_TABLE_SIZE);
        Self {
            state: State::Preface(0),
            decoder,
            block: None,
        }
    }

    /// Consumes `input` and appends the bytes for the server to `out`. Input
    /// may be split anywhere; the output does not depend on how. After an
    /// error every later call fails with it too.
    pub fn feed(&mut self, input: &[u8], out: &mut Vec<u8>) -> Result<(), AuthorityError> {
        match self.step_all(input, out) {
            Ok(()) => Ok(()),
            Err(e) => {
                self.state = State::Failed(e.clone());
                self.block = None;
                Err(e)
            }
        }
    }

    fn step_all(&mut self, mut input: &[u8], out: &mut Vec<u8>) -> Result<(), AuthorityError> {
        while !input.is_empty() {
            match &mut self.state {
                State::Failed(e) => return Err(e.clone()),
                State::Passthrough => {
                    out.extend_from_slice(input);
                    return Ok(());
                }
                State::Preface(matched) => {
                    let want = &PREFACE[*matched..];
                    let n = want.len().min(input.len());
                    if input[..n] == want[..n] {
                        *matched += n;
                        input = &input[n..];
                        if *matched == PREFACE.len() {
                            out.extend_from_slice(PREFACE);
                            self.state = State::Head([0; FRAME_HEAD], 0);
                        }
                    } else {
                        out.extend_from_slice(&PREFACE[..*matched]);
                        self.state = State::Passthrough;
                    }
                }
                State::Head(buf, got) => {
                    let n = (FRAME_HEAD - *got).min(input.len());
                    buf[*got..*got + n].copy_from_slice(&input[..n]);
                    *got += n;
                    input = &input[n..];
                    if *got == FRAME_HEAD {
                        let raw = *buf;
                        self.state = self.on_head(&raw, out)?;
                    }
                }
                State::Forward(remaining) => {
                    let n = (*remaining).min(input.len());
                    out.extend_from_slice(&input[..n]);
                    input = &input[n..];
                    *remaining -= n;
                    if *remaining == 0 {
                        self.state = State::Head([0; FRAME_HEAD], 0);
                    }
                }
                State::Collect(head, payload) => {
                    let n = (head.len - payload.len()).min(input.len());
                    payload.extend_from_slice(&input[..n]);
                    input = &input[n..];
                    if payload.len() == head.len {
                        let head = *head;
                        let payload = std::mem::take(payload);
                        self.state = State::Head([0; FRAME_HEAD], 0);
                        self.on_header_frame(head, &payload, out)?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Decides what to do with a frame from its header; returns the next state.
    fn on_head(
        &mut self,
        raw: &[u8; FRAME_HEAD],
        out: &mut Vec<u8>,
    ) -> Result<State, AuthorityError> {
        let head = FrameHead::parse(raw);
        // A header block must be contiguous (RFC 9113 §4.3): anything but
        // its CONTINUATION in between is a connection error.
        if let Some(block) = &self.block {
            if head.kind != CONTINUATION || head.stream != block.stream {
                return Err(AuthorityError::ExpectedContinuation {
                    expected: block.stream,
                    kind: head.kind,
                    stream: head.stream,
                });
            }
        }
        match head.kind {
            HEADERS | CONTINUATION => {
                let collected = self.block.as_ref().map_or(0, |b| b.fragment.len());
                if head.kind == CONTINUATION && self.block.is_none() {
                    return Err(AuthorityError::UnexpectedContinuation {
                        stream: head.stream,
                    });
                }
                if collected.saturating_add(head.len) > MAX_HEADER_BLOCK {
                    return Err(AuthorityError::BlockTooLarge {
                        stream: head.stream,
                    });
                }
                if head.len == 0 {
                    self.on_header_frame(head, &[], out)?;
                    return Ok(State::Head([0; FRAME_HEAD], 0));
                }
                Ok(State::Collect(head, Vec::with_capacity(head.len)))
            }
            // It would carry a header block we would have to decode to keep
            // the HPACK state, and a server rejects it anyway.
            PUSH_PROMISE => Err(AuthorityError::PushPromise),
            _ => {
                out.extend_from_slice(raw);
                Ok(if head.len == 0 {
                    State::Head([0; FRAME_HEAD], 0)
                } else {
                    State::Forward(head.len)
                })
            }
        }
    }

    /// A complete HEADERS or CONTINUATION payload.
    fn on_header_frame(
        &mut self,
        head: FrameHead,
        payload: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(), AuthorityError> {
        if head.kind == HEADERS {
            let stream = head.stream;
            let mut rest = payload;
            let mut pad = 0;
            if head.flags & PADDED != 0 {
                let Some((&n, tail)) = rest.split_first() else {
                    return Err(AuthorityError::BadPadding { stream });
                };
                pad = usize::from(n);
                rest = tail;
            }
            let mut priority = None;
            if head.flags & PRIORITY != 0 {
                let Some((fields, tail)) = rest.split_first_chunk::<PRIORITY_LEN>() else {
                    return Err(AuthorityError::ShortPriority { stream });
                };
                priority = Some(*fields);
                rest = tail;
            }
            let Some(fragment) = rest.len().checked_sub(pad).map(|n| &rest[..n]) else {
                return Err(AuthorityError::BadPadding { stream });
            };
            self.block = Some(Block {
                stream,
                end_stream: head.flags & END_STREAM != 0,
                priority,
                fragment: fragment.to_vec(),
            });
        } else if let Some(block) = &mut self.block {
            block.fragment.extend_from_slice(payload);
        }
        if head.flags & END_HEADERS != 0 {
            if let Some(block) = self.block.take() {
                self.emit(block, out)?;
            }
        }
        Ok(())
    }

    /// Decodes a complete block, rewrites it and writes it out as frames.
    fn emit(&mut self, block: Block, out: &mut Vec<u8>) -> Result<(), AuthorityError> {
        let stream = block.stream;
        let mut fields: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
        let mut size = 0usize;
        let decoded = self.decoder.decode_with_cb(&block.fragment, |name, value| {
            size = size.saturating_add(name.len() + value.len() + 32);
            // Past the bound nothing more is copied; the block is refused
            // below once the decoder has kept its table in step.
            if size <= MAX_HEADER_LIST {
                let value = if &*name == b":authority" {
                    AUTHORITY.to_vec()
                } else {
                    value.into_owned()
                };
                fields.push((name.into_owned(), value));
            }
        });
        if let Err(e) = decoded {
            return Err(AuthorityError::Hpack {
                stream,
                reason: e.to_string(),
            });
        }
        if size > MAX_HEADER_LIST {
            return Err(AuthorityError::ListTooLarge { stream });
        }
        let mut encoded = Vec::with_capacity(block.fragment.len() + 16);
        for (name, value) in &fields {
            encode_field(name, value, &mut encoded);
        }
        write_block(&block, &encoded, out);
        Ok(())
    }
}

/// HEADERS (+ CONTINUATIONs) carrying `encoded`, each frame within [`MAX_FRAME`].
fn write_block(block: &Block, encoded: &[u8], out: &mut Vec<u8>) {
    let prio_len = block.priority.map_or(0, |_| PRIORITY_LEN);
    let first_len = encoded.len().min(MAX_FRAME - prio_len);
    let (first, mut rest) = encoded.split_at(first_len);
    let mut flags = 0;
    if block.end_stream {
        flags |= END_STREAM;
    }
    if block.priority.is_some() {
        flags |= PRIORITY;
    }
    if rest.is_empty() {
        flags |= END_HEADERS;
    }
    write_head(out, prio_len + first.len(), HEADERS, flags, block.stream);
    if let Some(p) = &block.priority {
        out.extend_from_slice(p);
    }
    out.extend_from_slice(first);
    while !rest.is_empty() {
        let (chunk, tail) = rest.split_at(rest.len().min(MAX_FRAME));
        rest = tail;
        let flags = if rest.is_empty() { END_HEADERS } else { 0 };
        write_head(out, chunk.len(), CONTINUATION, flags, block.stream);
        out.extend_from_slice(chunk);
    }
}

fn write_head(out: &mut Vec<u8>, len: usize, kind: u8, flags: u8, stream: u32) {
    // len <= MAX_FRAME, so it fits the 24-bit length field.
    let len = (len as u32).to_be_bytes();
    out.extend_from_slice(&[len[1], len[2], len[3], kind, flags]);
    out.extend_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
}

/// The HPACK static table (RFC 7541 Appendix A); index = position + 1.
const STATIC_TABLE: [(&[u8], &[u8]); 61] = [
    (b":authority", b""),
    (b":method", b"GET"),
    (b":method", b"POST"),
    (b":path", b"/"),
    (b":path", b"/index.html"),
    (b":scheme", b"http"),
    (b":scheme", b"https"),
    (b":status", b"200"),
    (b":status", b"204"),
    (b":status", b"206"),
    (b":status", b"304"),
    (b":status", b"400"),
    (b":status", b"404"),
    (b":status", b"500"),
    (b"accept-charset", b""),
    (b"accept-encoding", b"gzip, deflate"),
    (b"accept-language", b""),
    (b"accept-ranges", b""),
    (b"accept", b""),
    (b"access-control-allow-origin", b""),
    (b"age", b""),
    (b"allow", b""),
    (b"authorization", b""),
    (b"cache-control", b""),
    (b"content-disposition", b""),
    (b"content-encoding", b""),
    (b"content-language", b""),
    (b"content-length", b""),
    (b"content-location", b""),
    (b"content-range", b""),
    (b"content-type", b""),
    (b"cookie", b""),
    (b"date", b""),
    (b"etag", b""),
    (b"expect", b""),
    (b"expires", b""),
    (b"from", b""),
    (b"host", b""),
    (b"if-match", b""),
    (b"if-modified-since", b""),
    (b"if-none-match", b""),
    (b"if-range", b""),
    (b"if-unmodified-since", b""),
    (b"last-modified", b""),
    (b"link", b""),
    (b"location", b""),
    (b"max-forwards", b""),
    (b"proxy-authenticate", b""),
    (b"proxy-authorization", b""),
    (b"range", b""),
    (b"referer", b""),
    (b"refresh", b""),
    (b"retry-after", b""),
    (b"server", b""),
    (b"set-cookie", b""),
    (b"strict-transport-security", b""),
    (b"transfer-encoding", b""),
    (b"user-agent", b""),
    (b"vary", b""),
    (b"via", b""),
    (b"www-authenticate", b""),
];

/// One field without touching the dynamic table: the static index of the
/// whole field if there is one, else a never-indexed literal (with the
/// name's static index when it has one). Strings are not Huffman-coded.
fn encode_field(name: &[u8], value: &[u8], out: &mut Vec<u8>) {
    let mut name_index = 0;
    for (i, (n, v)) in STATIC_TABLE.iter().enumerate() {
        if *n == name {
            if *v == value {
                encode_int(i + 1, 7, 0x80, out);
                return;
            }
            if name_index == 0 {
                name_index = i + 1;
            }
        }
    }
    encode_int(name_index, 4, 0x10, out);
    if name_index == 0 {
        encode_str(name, out);
    }
    encode_str(value, out);
}

fn encode_str(s: &[u8], out: &mut Vec<u8>) {
    encode_int(s.len(), 7, 0x00, out);
    out.extend_from_slice(s);
}

/// An HPACK integer with an `prefix`-bit prefix, `pattern` in the bits above.
fn encode_int(mut value: usize, prefix: u8, pattern: u8, out: &mut Vec<u8>) {
    let max = (1usize << prefix) - 1;
    if value < max {
        out.push(pattern | value as u8);
        return;
    }
    out.push(pattern | max as u8);
    value -= max;
    while value >= 0x80 {
        out.push((value & 0x7f) as u8 | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// How much is read from the connection at a time.
const READ_CHUNK: usize = 8 * 1024;

/// A server-side connection whose client header blocks reach the server with
/// `:authority: localhost`. Writes pass straight through.
pub struct LocalhostAuthority<T> {
    inner: T,
    rewriter: Rewriter,
    /// Rewritten bytes not yet handed to the server, from `pos` on.
    out: Vec<u8>,
    pos: usize,
    scratch: Box<[u8]>,
    /// Reported once `out` is drained, so the server sees every frame that
    /// preceded the offending one.
    error: Option<AuthorityError>,
}

impl<T> LocalhostAuthority<T> {
    pub fn new(inner: T) -> Self {
        Self {
            inner,
            rewriter: Rewriter::new(),
            out: Vec::new(),
            pos: 0,
            scratch: vec![0; READ_CHUNK].into_boxed_slice(),
            error: None,
        }
    }

    pub fn get_ref(&self) -> &T {
        &self.inner
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for LocalhostAuthority<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if this.pos < this.out.len() {
                let n = buf.remaining().min(this.out.len() - this.pos);
                buf.put_slice(&this.out[this.pos..this.pos + n]);
                this.pos += n;
                if this.pos == this.out.len() {
                    this.out.clear();
                    this.pos = 0;
                }
                return Poll::Ready(Ok(()));
            }
            if let Some(e) = &this.error {
                return Poll::Ready(Err(e.clone().into()));
            }
            let mut read = ReadBuf::new(&mut this.scratch);
            ready!(Pin::new(&mut this.inner).poll_read(cx, &mut read))?;
            let n = read.filled().len();
            if n == 0 {
                return Poll::Ready(Ok(()));
            }
            if let Err(e) = this.rewriter.feed(&this.scratch[..n], &mut this.out) {
                tracing::warn!(error = %e, "closing a gRPC connection: bad client header block");
                this.error = Some(e);
            }
        }
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for LocalhostAuthority<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

impl<T: Connected> Connected for LocalhostAuthority<T> {
    type ConnectInfo = T::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

/// The connections of `listener`, rewritten, for
/// `tonic::transport::Server::serve_with_incoming`.
pub fn incoming(
    listener: UnixListener,
) -> impl Stream<Item = io::Result<LocalhostAuthority<UnixStream>>> {
    UnixListenerStream::new(listener).map(|conn| conn.map(LocalhostAuthority::new))
}

#[cfg(test)]
mod tests;

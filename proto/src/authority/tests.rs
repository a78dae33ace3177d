//! Hand-made frames for each rule, and properties over generated and mutated
//! frame streams (proptest).

use loona_hpack::{Decoder, Encoder};
use proptest::prelude::*;

use super::*;

type Fields = Vec<(Vec<u8>, Vec<u8>)>;

const DATA: u8 = 0x0;
const SETTINGS: u8 = 0x4;
const WINDOW_UPDATE: u8 = 0x8;

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::new();
    let len = (payload.len() as u32).to_be_bytes();
    f.extend_from_slice(&[len[1], len[2], len[3], kind, flags]);
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

fn with_preface(frames: &[Vec<u8>]) -> Vec<u8> {
    let mut v = PREFACE.to_vec();
    for f in frames {
        v.extend_from_slice(f);
    }
    v
}

fn rewrite(input: &[u8]) -> Result<Vec<u8>, AuthorityError> {
    let mut out = Vec::new();
    Rewriter::new().feed(input, &mut out)?;
    Ok(out)
}

/// Output and outcome when `input` arrives in pieces of the given sizes.
fn rewrite_chunked(input: &[u8], sizes: &[usize]) -> (Vec<u8>, Option<AuthorityError>) {
    let mut r = Rewriter::new();
    let mut out = Vec::new();
    let mut rest = input;
    let mut sizes = sizes.iter().cycle();
    while !rest.is_empty() {
        let n = sizes
            .next()
            .copied()
            .unwrap_or(rest.len())
            .clamp(1, rest.len());
        let (chunk, tail) = rest.split_at(n);
        rest = tail;
        if let Err(e) = r.feed(chunk, &mut out) {
            return (out, Some(e));
        }
    }
    (out, None)
}

#[derive(Debug, PartialEq)]
struct Frame {
    kind: u8,
    flags: u8,
    stream: u32,
    payload: Vec<u8>,
}

/// Splits a rewritten stream (after the preface) into frames.
fn parse_frames(out: &[u8]) -> Vec<Frame> {
    assert!(out.starts_with(PREFACE), "preface forwarded first");
    let mut rest = &out[PREFACE.len()..];
    let mut frames = Vec::new();
    while !rest.is_empty() {
        assert!(rest.len() >= FRAME_HEAD, "truncated frame header");
        let head = FrameHead::parse(rest[..FRAME_HEAD].try_into().unwrap());
        let payload = rest[FRAME_HEAD..FRAME_HEAD + head.len].to_vec();
        rest = &rest[FRAME_HEAD + head.len..];
        frames.push(Frame {
            kind: head.kind,
            flags: head.flags,
            stream: head.stream,
            payload,
        });
    }
    frames
}

/// A header block as the server sees it.
#[derive(Debug)]
struct SeenBlock {
    stream: u32,
    flags: u8,
    priority: Option<Vec<u8>>,
    block: Vec<u8>,
}

/// Reassembles the rewritten header blocks, checking that we never pad and
/// never exceed the default frame size; other frames are returned as they are.
fn header_blocks(frames: &[Frame]) -> (Vec<SeenBlock>, Vec<&Frame>) {
    let mut blocks: Vec<SeenBlock> = Vec::new();
    let mut others = Vec::new();
    let mut open = false;
    for f in frames {
        assert!(f.payload.len() <= MAX_FRAME, "frame larger than 16384");
        match f.kind {
            HEADERS => {
                assert!(!open, "HEADERS inside a block");
                assert_eq!(f.flags & PADDED, 0, "we never pad");
                let (priority, block) = if f.flags & PRIORITY != 0 {
                    (Some(f.payload[..5].to_vec()), f.payload[5..].to_vec())
                } else {
                    (None, f.payload.clone())
                };
                blocks.push(SeenBlock {
                    stream: f.stream,
                    flags: f.flags,
                    priority,
                    block,
                });
                open = f.flags & END_HEADERS == 0;
            }
            CONTINUATION => {
                assert!(open, "CONTINUATION outside a block");
                let b = blocks.last_mut().unwrap();
                assert_eq!(b.stream, f.stream);
                b.block.extend_from_slice(&f.payload);
                open = f.flags & END_HEADERS == 0;
            }
            _ => {
                assert!(!open, "frame inside a block");
                others.push(f);
            }
        }
    }
    assert!(!open, "last block unterminated");
    (blocks, others)
}

/// Decodes a rewritten block with a decoder that has no dynamic table at all:
/// proves the block neither uses nor fills one.
fn decode_stateless(block: &[u8]) -> Fields {
    let mut d = Decoder::new();
    d.set_max_table_size(0);
    let fields = d.decode(block).expect("rewritten block decodes");
    // Nothing was inserted either: a size-0 table evicts at once, so check
    // the representation bits of each field instead.
    assert_no_indexing(block);
    fields
}

/// Every field representation is "indexed" (1xxxxxxx) or "never indexed"
/// (0001xxxx); no incremental indexing, no size update.
fn assert_no_indexing(block: &[u8]) {
    let mut i = 0;
    let int = |i: &mut usize, prefix: u8| -> usize {
        let max = (1usize << prefix) - 1;
        let mut v = usize::from(block[*i]) & max;
        *i += 1;
        if v == max {
            let mut m = 0;
            loop {
                let b = block[*i];
                *i += 1;
                v += usize::from(b & 0x7f) << m;
                m += 7;
                if b & 0x80 == 0 {
                    break;
                }
            }
        }
        v
    };
    while i < block.len() {
        let b = block[i];
        if b & 0x80 != 0 {
            int(&mut i, 7);
        } else {
            assert_eq!(b & 0xf0, 0x10, "field at {i} is not never-indexed: {b:#x}");
            if int(&mut i, 4) == 0 {
                let n = int(&mut i, 7);
                i += n;
            }
            let n = int(&mut i, 7);
            i += n;
        }
    }
}

fn fields(list: &[(&str, &str)]) -> Fields {
    list.iter()
        .map(|(n, v)| (n.as_bytes().to_vec(), v.as_bytes().to_vec()))
        .collect()
}

fn with_localhost(f: &Fields) -> Fields {
    f.iter()
        .map(|(n, v)| {
            if n == b":authority" {
                (n.clone(), AUTHORITY.to_vec())
            } else {
                (n.clone(), v.clone())
            }
        })
        .collect()
}

fn hex(s: &str) -> Vec<u8> {
    let s: String = s.split_whitespace().collect();
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

#[test]
fn static_table_matches_the_decoders() {
    let mut d = Decoder::new();
    for (i, (n, v)) in STATIC_TABLE.iter().enumerate() {
        let got = d.decode(&[0x80 | (i as u8 + 1)]).unwrap();
        assert_eq!(
            got,
            vec![(n.to_vec(), v.to_vec())],
            "static index {}",
            i + 1
        );
    }
}

#[test]
fn integers_past_their_prefix() {
    let mut out = Vec::new();
    encode_int(1337, 5, 0, &mut out);
    assert_eq!(out, [31, 154, 10]); // RFC 7541 C.1.2
    for n in [0, 14, 15, 16, 127, 128, 300, 70000] {
        let mut out = Vec::new();
        encode_str(&vec![b'x'; n], &mut out);
        let got = Decoder::new()
            .decode(&[&[0x10u8, 0x01, b'a'][..], &out].concat())
            .unwrap();
        assert_eq!(got[0].1.len(), n);
    }
}

/// RFC 7541 C.4.1 and C.4.2: Huffman-coded strings, and the second request
/// refers to the first one's `:authority` through the dynamic table.
#[test]
fn huffman_and_dynamic_table_across_two_requests() {
    let first = hex("8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff");
    let second = hex("8286 84be 5886 a8eb 1064 9cbf");
    let input = with_preface(&[
        frame(SETTINGS, 0, 0, &[]),
        frame(HEADERS, END_HEADERS, 1, &first),
        frame(HEADERS, END_HEADERS | END_STREAM, 3, &second),
    ]);
    // What the client meant, per the RFC.
    let mut client = Decoder::new();
    assert_eq!(
        client.decode(&first).unwrap(),
        fields(&[
            (":method", "GET"),
            (":scheme", "http"),
            (":path", "/"),
            (":authority", "www.example.com")
        ])
    );
    assert_eq!(
        client.decode(&second).unwrap(),
        fields(&[
            (":method", "GET"),
            (":scheme", "http"),
            (":path", "/"),
            (":authority", "www.example.com"),
            ("cache-control", "no-cache")
        ])
    );

    let out = rewrite(&input).unwrap();
    let frames = parse_frames(&out);
    assert_eq!(
        frames[0],
        Frame {
            kind: SETTINGS,
            flags: 0,
            stream: 0,
            payload: vec![]
        }
    );
    let (blocks, _) = header_blocks(&frames);
    assert_eq!(blocks.len(), 2);
    assert_eq!(
        decode_stateless(&blocks[0].block),
        fields(&[
            (":method", "GET"),
            (":scheme", "http"),
            (":path", "/"),
            (":authority", "localhost")
        ])
    );
    assert_eq!(
        decode_stateless(&blocks[1].block),
        fields(&[
            (":method", "GET"),
            (":scheme", "http"),
            (":path", "/"),
            (":authority", "localhost"),
            ("cache-control", "no-cache")
        ])
    );
    assert_eq!(
        (blocks[1].stream, blocks[1].flags),
        (3, END_HEADERS | END_STREAM)
    );
}

fn grpc_request(authority: &str) -> Fields {
    fields(&[
        (":method", "POST"),
        (":scheme", "http"),
        (":path", "/pluginregistration.Registration/GetInfo"),
        (":authority", authority),
        ("content-type", "application/grpc"),
        ("user-agent", "grpc-go/1.72.1"),
        ("te", "trailers"),
    ])
}

fn encode(enc: &mut Encoder, f: &Fields) -> Vec<u8> {
    enc.encode(f.iter().map(|(n, v)| (&n[..], &v[..])))
}

#[test]
fn socket_path_authority_becomes_localhost() {
    let req = grpc_request("/var/lib/kubelet/plugins_registry/x-reg.sock");
    let block = encode(&mut Encoder::new(), &req);
    let out = rewrite(&with_preface(&[frame(HEADERS, END_HEADERS, 1, &block)])).unwrap();
    let (blocks, _) = header_blocks(&parse_frames(&out));
    assert_eq!(decode_stateless(&blocks[0].block), with_localhost(&req));
    // The percent-encoded form some clients send goes the same way.
    let req = grpc_request("%2Fvar%2Flib%2Fkubelet%2Fplugins_registry%2Fx-reg.sock");
    let block = encode(&mut Encoder::new(), &req);
    let out = rewrite(&with_preface(&[frame(HEADERS, END_HEADERS, 1, &block)])).unwrap();
    let (blocks, _) = header_blocks(&parse_frames(&out));
    assert_eq!(decode_stateless(&blocks[0].block), with_localhost(&req));
}

#[test]
fn a_block_without_authority_gets_none() {
    let req = fields(&[(":method", "POST"), (":path", "/x"), ("te", "trailers")]);
    let block = encode(&mut Encoder::new(), &req);
    let out = rewrite(&with_preface(&[frame(HEADERS, END_HEADERS, 1, &block)])).unwrap();
    let (blocks, _) = header_blocks(&parse_frames(&out));
    assert_eq!(decode_stateless(&blocks[0].block), req);
}

#[test]
fn padding_is_dropped_and_priority_kept() {
    let req = grpc_request("/x.sock");
    let block = encode(&mut Encoder::new(), &req);
    let prio = [0x80, 0, 0, 1, 15]; // exclusive, depends on 1, weight 16
    let mut payload = vec![7];
    payload.extend_from_slice(&prio);
    payload.extend_from_slice(&block);
    payload.extend_from_slice(&[0; 7]);
    let input = with_preface(&[frame(
        HEADERS,
        END_HEADERS | END_STREAM | PADDED | PRIORITY,
        3,
        &payload,
    )]);
    let frames = parse_frames(&rewrite(&input).unwrap());
    assert_eq!(frames.len(), 1);
    assert_eq!(frames[0].flags, END_HEADERS | END_STREAM | PRIORITY);
    assert_eq!(frames[0].stream, 3);
    let (blocks, _) = header_blocks(&frames);
    assert_eq!(blocks[0].priority.as_deref(), Some(&prio[..]));
    assert_eq!(decode_stateless(&blocks[0].block), with_localhost(&req));

    // Padding that is all there is (an empty fragment) is fine too.
    let out = rewrite(&with_preface(&[frame(
        HEADERS,
        END_HEADERS | PADDED,
        1,
        &[2, 0, 0],
    )]));
    assert_eq!(frames_of(out).len(), 1);
}

fn frames_of(out: Result<Vec<u8>, AuthorityError>) -> Vec<Frame> {
    parse_frames(&out.unwrap())
}

#[test]
fn continuations_are_joined_and_large_blocks_split() {
    let req = grpc_request("/var/lib/kubelet/plugins_registry/x-reg.sock");
    let block = encode(&mut Encoder::new(), &req);
    let (a, rest) = block.split_at(10);
    let (b, c) = rest.split_at(20);
    let input = with_preface(&[
        frame(HEADERS, PRIORITY, 5, &[&[0, 0, 0, 0, 200][..], a].concat()),
        frame(CONTINUATION, 0, 5, b),
        frame(CONTINUATION, END_HEADERS, 5, c),
        frame(DATA, END_STREAM, 5, b"\0\0\0\0\0"),
    ]);
    let frames = parse_frames(&rewrite(&input).unwrap());
    let (blocks, others) = header_blocks(&frames);
    assert_eq!(decode_stateless(&blocks[0].block), with_localhost(&req));
    assert_eq!(blocks[0].priority.as_deref(), Some(&[0, 0, 0, 0, 200][..]));
    assert_eq!(
        others,
        [&Frame {
            kind: DATA,
            flags: END_STREAM,
            stream: 5,
            payload: vec![0; 5]
        }]
    );

    // A 40 kB value comes back in frames of at most 16384 bytes.
    let mut big = req.clone();
    big.push((b"x-big".to_vec(), vec![b'v'; 40_000]));
    let block = encode(&mut Encoder::new(), &big);
    let chunks: Vec<&[u8]> = block.chunks(12_000).collect();
    let mut input = vec![frame(HEADERS, END_STREAM, 1, chunks[0])];
    for (i, c) in chunks[1..].iter().enumerate() {
        let last = i == chunks.len() - 2;
        input.push(frame(
            CONTINUATION,
            if last { END_HEADERS } else { 0 },
            1,
            c,
        ));
    }
    let frames = parse_frames(&rewrite(&with_preface(&input)).unwrap());
    assert!(frames.len() >= 3, "{} frames", frames.len());
    assert_eq!(
        frames[0].flags, END_STREAM,
        "END_STREAM on HEADERS, END_HEADERS on the last"
    );
    assert!(frames[1..frames.len() - 1]
        .iter()
        .all(|f| f.kind == CONTINUATION && f.flags == 0));
    assert_eq!(frames.last().unwrap().flags, END_HEADERS);
    let (blocks, _) = header_blocks(&frames);
    assert_eq!(decode_stateless(&blocks[0].block), with_localhost(&big));
}

#[test]
fn other_frames_and_non_http2_bytes_pass_untouched() {
    let input = with_preface(&[
        frame(SETTINGS, 0, 0, &[0, 4, 0, 1, 0, 0]),
        frame(WINDOW_UPDATE, 0, 0, &[0, 0, 0x40, 0]),
        frame(0xfa, 0xff, 0x8000_0007, b"unknown"),
        frame(DATA, 0, 1, &[1; 100]),
    ]);
    assert_eq!(rewrite(&input).unwrap(), input);
    let (out, err) = rewrite_chunked(&input, &[1, 2, 3, 5, 8]);
    assert_eq!((out, err), (input, None));
    for junk in [&b"GET / HTTP/1.1\r\n\r\n"[..], b"PRI * HTTP/1.1", b"PX"] {
        assert_eq!(rewrite(junk).unwrap(), junk);
        assert_eq!(rewrite_chunked(junk, &[1]), (junk.to_vec(), None));
    }
    // A prefix of the preface is held until it is known to be one or not.
    assert_eq!(rewrite(b"PRI * HTTP/2").unwrap(), b"");
}

#[test]
fn dynamic_table_size_updates_are_honoured() {
    let mut enc = Encoder::new();
    let req = grpc_request("/a.sock");
    let first = encode(&mut enc, &req);
    let second = encode(&mut enc, &req); // all references into the table
                                         // The client shrinks its table to 0 (evicting everything), then refers to
                                         // an entry: the decoder must have followed the update and refuse.
    let mut shrunk = vec![0x20];
    shrunk.extend_from_slice(&second);
    let input = with_preface(&[
        frame(HEADERS, END_HEADERS, 1, &first),
        frame(HEADERS, END_HEADERS, 3, &shrunk),
    ]);
    assert!(matches!(
        rewrite(&input),
        Err(AuthorityError::Hpack { stream: 3, .. })
    ));
    // Without the update the same references decode.
    let input = with_preface(&[
        frame(HEADERS, END_HEADERS, 1, &first),
        frame(HEADERS, END_HEADERS, 3, &second),
    ]);
    let (blocks, _) = header_blocks(&parse_frames(&rewrite(&input).unwrap()));
    assert_eq!(decode_stateless(&blocks[1].block), with_localhost(&req));
    // A table larger than MAX_TABLE_SIZE is refused (size update 0x3f + int).
    let mut huge = vec![0x3f];
    huge.extend_from_slice(&[0xe2, 0xff, 0x03]); // 31 + 65506 = 65537
    huge.push(0x82);
    let input = with_preface(&[frame(HEADERS, END_HEADERS, 1, &huge)]);
    assert!(matches!(rewrite(&input), Err(AuthorityError::Hpack { .. })));
}

#[test]
fn violations_end_the_connection() {
    let ok = encode(&mut Encoder::new(), &grpc_request("/a"));
    let cases: Vec<(Vec<Vec<u8>>, AuthorityError)> = vec![
        (
            vec![frame(HEADERS, 0, 1, &ok[..5]), frame(DATA, 0, 1, b"x")],
            AuthorityError::ExpectedContinuation {
                expected: 1,
                kind: DATA,
                stream: 1,
            },
        ),
        (
            vec![
                frame(HEADERS, 0, 1, &ok[..5]),
                frame(CONTINUATION, END_HEADERS, 3, &ok[5..]),
            ],
            AuthorityError::ExpectedContinuation {
                expected: 1,
                kind: CONTINUATION,
                stream: 3,
            },
        ),
        (
            vec![frame(CONTINUATION, END_HEADERS, 1, &ok)],
            AuthorityError::UnexpectedContinuation { stream: 1 },
        ),
        (
            vec![frame(HEADERS, END_HEADERS | PADDED, 1, &[9, 1, 2])],
            AuthorityError::BadPadding { stream: 1 },
        ),
        (
            vec![frame(HEADERS, END_HEADERS | PADDED, 1, &[])],
            AuthorityError::BadPadding { stream: 1 },
        ),
        (
            vec![frame(HEADERS, END_HEADERS | PRIORITY, 1, &[0, 0, 0])],
            AuthorityError::ShortPriority { stream: 1 },
        ),
        (
            vec![frame(PUSH_PROMISE, END_HEADERS, 1, &[0, 0, 0, 2])],
            AuthorityError::PushPromise,
        ),
        (
            vec![frame(HEADERS, 0, 1, &vec![0; MAX_HEADER_BLOCK + 1])],
            AuthorityError::BlockTooLarge { stream: 1 },
        ),
        (
            vec![
                frame(HEADERS, 0, 1, &vec![0; MAX_HEADER_BLOCK / 2]),
                frame(CONTINUATION, 0, 1, &vec![0; MAX_HEADER_BLOCK / 2]),
                frame(CONTINUATION, END_HEADERS, 1, &[0]),
            ],
            AuthorityError::BlockTooLarge { stream: 1 },
        ),
    ];
    for (frames, want) in cases {
        let input = with_preface(&frames);
        assert_eq!(rewrite(&input), Err(want.clone()));
        assert_eq!(rewrite_chunked(&input, &[3, 7]).1, Some(want.clone()));
    }
    // Index out of range, and a string longer than the block.
    for bad in [&[0xff, 0xff, 0x7f][..], &[0x10, 0x05, b'a']] {
        let input = with_preface(&[frame(HEADERS, END_HEADERS, 1, bad)]);
        assert!(matches!(
            rewrite(&input),
            Err(AuthorityError::Hpack { stream: 1, .. })
        ));
    }
    // A small block that references a 4 kB table entry 100 times.
    // A 4000-byte value (127 + 33 + 30 * 128): the entry (4033) fits the
    // default 4096-byte table.
    let mut bomb = vec![0x40, 0x01, b'a', 0x7f, 0xa1, 0x1e];
    bomb.extend_from_slice(&vec![b'v'; 4000]);
    bomb.extend_from_slice(&[0x80 | 62; 100]);
    let input = with_preface(&[frame(HEADERS, END_HEADERS, 1, &bomb)]);
    assert_eq!(
        rewrite(&input),
        Err(AuthorityError::ListTooLarge { stream: 1 })
    );
    // After an error the rewriter stays failed.
    let mut r = Rewriter::new();
    let mut out = Vec::new();
    assert!(r
        .feed(&with_preface(&[frame(PUSH_PROMISE, 0, 1, &[])]), &mut out)
        .is_err());
    assert_eq!(
        r.feed(&frame(SETTINGS, 0, 0, &[]), &mut out),
        Err(AuthorityError::PushPromise)
    );
}

#[tokio::test]
async fn the_io_wrapper_rewrites_reads_and_passes_writes() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (mut client, server) = UnixStream::pair().unwrap();
    let mut server = LocalhostAuthority::new(server);
    let req = grpc_request("/var/lib/kubelet/plugins_registry/x-reg.sock");
    let input = with_preface(&[frame(
        HEADERS,
        END_HEADERS,
        1,
        &encode(&mut Encoder::new(), &req),
    )]);
    let expected = rewrite(&input).unwrap();
    client.write_all(&input).await.unwrap();
    let mut got = vec![0; expected.len()];
    server.read_exact(&mut got).await.unwrap();
    assert_eq!(got, expected);
    server.write_all(b"server bytes").await.unwrap();
    let mut back = [0; 12];
    client.read_exact(&mut back).await.unwrap();
    assert_eq!(&back, b"server bytes");
    // A violation: the frames before it are delivered, then the read fails.
    client.write_all(&frame(SETTINGS, 0, 0, &[])).await.unwrap();
    client
        .write_all(&frame(PUSH_PROMISE, 0, 1, &[]))
        .await
        .unwrap();
    let mut settings = [0; 9];
    server.read_exact(&mut settings).await.unwrap();
    assert_eq!(settings.to_vec(), frame(SETTINGS, 0, 0, &[]));
    let err = server.read(&mut [0; 16]).await.unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::InvalidData);
    // End of stream is end of stream.
    let (client, server) = UnixStream::pair().unwrap();
    drop(client);
    let mut server = LocalhostAuthority::new(server);
    assert_eq!(server.read(&mut [0; 16]).await.unwrap(), 0);
}

// --- properties ------------------------------------------------------------

/// Names a gRPC client sends, so the client's dynamic table gets reused.
const NAMES: &[&str] = &[
    ":authority",
    ":method",
    ":path",
    ":scheme",
    "content-type",
    "te",
    "user-agent",
    "grpc-timeout",
    "x-custom",
    "cache-control",
];

fn field() -> impl Strategy<Value = (Vec<u8>, Vec<u8>)> {
    (
        prop::sample::select(NAMES),
        prop_oneof![
            Just("/var/lib/kubelet/plugins_registry/x-reg.sock".to_string()),
            Just("%2Fcsi%2Fcsi.sock".to_string()),
            Just("POST".to_string()),
            "[ -~]{0,40}",
        ],
    )
        .prop_map(|(n, v)| (n.as_bytes().to_vec(), v.into_bytes()))
}

/// How one block is framed.
#[derive(Clone, Debug)]
struct Framing {
    stream: u32,
    end_stream: bool,
    pad: Option<u8>,
    priority: Option<[u8; 5]>,
    /// Fragment split points, as fractions of the block.
    splits: Vec<u16>,
    /// An untouched frame sent after the block.
    after: Option<(u8, u8, Vec<u8>)>,
}

fn framing() -> impl Strategy<Value = Framing> {
    (
        1u32..1000,
        any::<bool>(),
        prop::option::of(any::<u8>()),
        prop::option::of(any::<[u8; 5]>()),
        prop::collection::vec(any::<u16>(), 0..4),
        prop::option::of((
            prop::sample::select(&[DATA, SETTINGS, WINDOW_UPDATE, 0x2, 0x3, 0x6, 0x7, 0xee][..]),
            any::<u8>(),
            prop::collection::vec(any::<u8>(), 0..64),
        )),
    )
        .prop_map(
            |(stream, end_stream, pad, priority, splits, after)| Framing {
                stream: stream * 2 + 1,
                end_stream,
                pad,
                priority,
                splits,
                after,
            },
        )
}

fn frame_block(block: &[u8], f: &Framing) -> Vec<Vec<u8>> {
    let mut cuts: Vec<usize> = f
        .splits
        .iter()
        .map(|s| usize::from(*s) * block.len() / usize::from(u16::MAX))
        .collect();
    cuts.sort_unstable();
    cuts.dedup();
    let mut pieces = Vec::new();
    let mut last = 0;
    for c in cuts {
        pieces.push(&block[last..c]);
        last = c;
    }
    pieces.push(&block[last..]);
    let mut frames = Vec::new();
    for (i, piece) in pieces.iter().enumerate() {
        let end = if i + 1 == pieces.len() {
            END_HEADERS
        } else {
            0
        };
        if i == 0 {
            let mut flags = end;
            let mut payload = Vec::new();
            if let Some(p) = f.pad {
                flags |= PADDED;
                payload.push(p);
            }
            if let Some(p) = f.priority {
                flags |= PRIORITY;
                payload.extend_from_slice(&p);
            }
            if f.end_stream {
                flags |= END_STREAM;
            }
            payload.extend_from_slice(piece);
            payload.extend(std::iter::repeat_n(0, usize::from(f.pad.unwrap_or(0))));
            frames.push(frame(HEADERS, flags, f.stream, &payload));
        } else {
            frames.push(frame(CONTINUATION, end, f.stream, piece));
        }
    }
    if let Some((kind, flags, payload)) = &f.after {
        frames.push(frame(*kind, *flags, f.stream, payload));
    }
    frames
}

/// A connection's worth of requests, encoded with the dynamic table (so
/// later blocks refer to earlier ones), and the frames carrying them.
fn connection() -> impl Strategy<Value = (Vec<Fields>, Vec<Framing>, Vec<u8>)> {
    prop::collection::vec((prop::collection::vec(field(), 0..8), framing()), 1..6).prop_map(
        |reqs| {
            let mut enc = Encoder::new();
            let mut frames = vec![frame(SETTINGS, 0, 0, &[])];
            let mut lists = Vec::new();
            let mut framings = Vec::new();
            for (list, f) in reqs {
                let block = encode(&mut enc, &list);
                frames.extend(frame_block(&block, &f));
                lists.push(list);
                framings.push(f);
            }
            (lists, framings, with_preface(&frames))
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// decode(rewrite(x)) = decode(x) with `:authority` replaced, whatever
    /// the framing and however the bytes arrive; other frames are untouched.
    #[test]
    fn round_trip((lists, framings, input) in connection(),
                  sizes in prop::collection::vec(1usize..64, 1..8)) {
        let whole = rewrite(&input).unwrap();
        let (chunked, err) = rewrite_chunked(&input, &sizes);
        prop_assert_eq!(err, None);
        prop_assert_eq!(&chunked, &whole);
        let frames = parse_frames(&whole);
        let (blocks, others) = header_blocks(&frames);
        prop_assert_eq!(blocks.len(), lists.len());
        let mut expected_others = vec![Frame { kind: SETTINGS, flags: 0, stream: 0, payload: vec![] }];
        for ((seen, list), f) in blocks.iter().zip(&lists).zip(&framings) {
            prop_assert_eq!(decode_stateless(&seen.block), with_localhost(list));
            prop_assert_eq!(seen.stream, f.stream);
            prop_assert_eq!(seen.flags & END_STREAM != 0, f.end_stream);
            prop_assert_eq!(seen.priority.clone(), f.priority.map(|p| p.to_vec()));
            if let Some((kind, flags, payload)) = &f.after {
                expected_others.push(Frame { kind: *kind, flags: *flags, stream: f.stream, payload: payload.clone() });
            }
        }
        let others: Vec<Frame> = others.into_iter().map(|f| Frame { payload: f.payload.clone(), ..*f }).collect();
        prop_assert_eq!(others, expected_others);
    }

    /// Mutated streams: never a panic, and the outcome (bytes and error) does
    /// not depend on how the input is split.
    #[test]
    fn mutated_streams((_, _, input) in connection(),
                       edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>(), 0u8..3), 1..6),
                       sizes in prop::collection::vec(1usize..40, 1..8)) {
        let mut input = input;
        for (at, byte, op) in edits {
            let i = at.index(input.len());
            match op {
                0 => input[i] = byte,
                1 => input.insert(i, byte),
                _ => input.truncate(i.max(PREFACE.len())),
            }
        }
        let mut r = Rewriter::new();
        let mut whole = Vec::new();
        let whole_err = r.feed(&input, &mut whole).err();
        prop_assert_eq!(rewrite_chunked(&input, &sizes), (whole, whole_err));
    }

    /// Arbitrary bytes after the preface: no panic, and the same outcome
    /// however they are split.
    #[test]
    fn random_frames(body in prop::collection::vec(any::<u8>(), 0..2048),
                     sizes in prop::collection::vec(1usize..40, 1..8)) {
        let input = [PREFACE, &body[..]].concat();
        let mut whole = Vec::new();
        let whole_err = Rewriter::new().feed(&input, &mut whole).err();
        prop_assert_eq!(rewrite_chunked(&input, &sizes), (whole, whole_err));
    }
}

//! The connection's state machine fed frames by hand.

use super::*;

/// A connection after the client's empty SETTINGS, with what it wrote so far dropped.
fn greeted() -> Conn<()> {
    let mut c = Conn::new(64 * 1024);
    feed(&mut c, kind::SETTINGS, 0, 0, &[]).unwrap();
    c.out.clear();
    c.written();
    c
}

fn feed(
    c: &mut Conn<()>,
    kind: u8,
    flags: u8,
    stream: u32,
    payload: &[u8],
) -> Result<Option<Incoming>, Reason> {
    let head = Head {
        len: payload.len(),
        kind,
        flags,
        stream,
    };
    c.receive(head, payload)
}

/// The frames written so far: (type, flags, stream, payload).
fn written(c: &mut Conn<()>) -> Vec<(u8, u8, u32, Vec<u8>)> {
    let mut frames = Vec::new();
    let mut at = 0;
    while at < c.out.len() {
        let h = Head::read(&c.out[at..]);
        let payload = c.out[at + 9..at + 9 + h.len].to_vec();
        frames.push((h.kind, h.flags, h.stream, payload));
        at += 9 + h.len;
    }
    c.out.clear();
    frames
}

/// `:method POST`, `:scheme http`, `:path /`, `:authority a`: static-table entries and
/// one literal.
const POST: [u8; 6] = [0x83, 0x86, 0x84, 0x41, 0x01, b'a'];
const GET: [u8; 6] = [0x82, 0x86, 0x84, 0x41, 0x01, b'a'];

#[test]
fn the_first_frame_must_be_settings_and_settings_are_acknowledged() {
    let mut c: Conn<()> = Conn::new(64 * 1024);
    let first = written(&mut c);
    assert_eq!(first[0].0, kind::SETTINGS);
    assert_eq!(first[1].0, kind::WINDOW_UPDATE);
    assert_eq!(
        feed(&mut c, kind::PING, 0, 0, &[0; 8]).unwrap_err(),
        Reason::PROTOCOL_ERROR
    );
    let mut c = greeted();
    feed(&mut c, kind::SETTINGS, 0, 0, &[0, 4, 0, 0, 0, 10]).unwrap();
    assert_eq!(written(&mut c), [(kind::SETTINGS, 1, 0, vec![])]);
}

#[test]
fn a_request_with_a_body_hands_its_bytes_over_and_windows_come_back_as_taken() {
    let mut c = greeted();
    let opened = feed(&mut c, kind::HEADERS, 0x4, 1, &POST).unwrap().unwrap();
    assert_eq!(opened.stream, 1);
    let mut body = opened.body.unwrap();
    let half = vec![7u8; (WINDOW / 2) as usize];
    for chunk in half.chunks(MAX_FRAME) {
        feed(&mut c, kind::DATA, 0, 1, chunk).unwrap();
    }
    c.give_back();
    assert!(
        written(&mut c).is_empty(),
        "nothing taken yet, nothing given back"
    );
    let waker = futures_util::task::noop_waker();
    let mut cx = std::task::Context::from_waker(&waker);
    let mut got = 0;
    while got < half.len() {
        use http_body::Body as _;
        match std::pin::Pin::new(&mut body).poll_frame(&mut cx) {
            std::task::Poll::Ready(Some(Ok(f))) => got += f.into_data().unwrap().len(),
            other => panic!("{other:?}"),
        }
    }
    c.give_back();
    let updates: Vec<u32> = written(&mut c)
        .iter()
        .filter(|f| f.0 == kind::WINDOW_UPDATE)
        .map(|f| f.2)
        .collect();
    assert_eq!(updates, [1, 0], "the stream's window and the connection's");
}

#[test]
fn more_than_a_window_is_a_flow_control_error_of_the_stream_then_of_the_connection() {
    let mut c = greeted();
    let frame = vec![0u8; MAX_FRAME];
    let per_stream = WINDOW as usize / MAX_FRAME;
    let mut id = 1;
    // Each stream takes its window whole (nobody reads the bodies); one frame more is
    // the stream's error, and its bytes go back to the connection.
    for _ in 0..(CONNECTION_WINDOW / WINDOW) {
        feed(&mut c, kind::HEADERS, 0x4, id, &POST).unwrap();
        for _ in 0..per_stream {
            feed(&mut c, kind::DATA, 0, id, &frame).unwrap();
        }
        id += 2;
    }
    c.out.clear();
    feed(&mut c, kind::HEADERS, 0x4, id, &POST).unwrap();
    // The connection's window is spent: any byte more is the connection's error.
    let err = feed(&mut c, kind::DATA, 0, id, &frame).unwrap_err();
    assert_eq!(err, Reason::FLOW_CONTROL_ERROR);
    let mut c = greeted();
    feed(&mut c, kind::HEADERS, 0x4, 1, &POST).unwrap();
    for _ in 0..per_stream {
        feed(&mut c, kind::DATA, 0, 1, &frame).unwrap();
    }
    feed(&mut c, kind::DATA, 0, 1, &frame).unwrap();
    let rst = written(&mut c)
        .into_iter()
        .find(|f| f.0 == kind::RST_STREAM)
        .unwrap();
    assert_eq!(rst.3, Reason::FLOW_CONTROL_ERROR.0.to_be_bytes());
}

#[test]
fn a_body_longer_or_shorter_than_its_content_length_resets_the_stream() {
    let mut c = greeted();
    let mut block = POST.to_vec();
    block.extend([0x0f, 0x0d, 1, b'3']); // content-length: 3
    feed(&mut c, kind::HEADERS, 0x4, 1, &block).unwrap();
    feed(&mut c, kind::DATA, 0x1, 1, b"ab").unwrap();
    let frames = written(&mut c);
    assert_eq!(frames[0].0, kind::RST_STREAM);
    assert_eq!(frames[0].3, Reason::PROTOCOL_ERROR.0.to_be_bytes());
}

#[test]
fn streams_out_of_order_or_closed_are_told_apart() {
    let mut c = greeted();
    feed(&mut c, kind::HEADERS, 0x5, 5, &GET).unwrap();
    assert_eq!(
        feed(&mut c, kind::HEADERS, 0x5, 3, &GET).unwrap_err(),
        Reason::PROTOCOL_ERROR
    );
    let mut c = greeted();
    feed(&mut c, kind::HEADERS, 0x5, 1, &GET).unwrap();
    c.send_head(1, &[0x88], true);
    assert_eq!(
        feed(&mut c, kind::HEADERS, 0x5, 1, &GET).unwrap_err(),
        Reason::STREAM_CLOSED
    );
    let mut c = greeted();
    assert_eq!(
        feed(&mut c, kind::HEADERS, 0x5, 2, &GET).unwrap_err(),
        Reason::PROTOCOL_ERROR
    );
}

#[test]
fn a_header_block_is_only_followed_by_its_continuation() {
    let mut c = greeted();
    assert!(feed(&mut c, kind::HEADERS, 0x1, 1, &GET[..3])
        .unwrap()
        .is_none());
    let opened = feed(&mut c, kind::CONTINUATION, 0x4, 1, &GET[3..]).unwrap();
    assert!(opened.is_some());
    let mut c = greeted();
    feed(&mut c, kind::HEADERS, 0x1, 1, &GET[..3]).unwrap();
    assert_eq!(
        feed(&mut c, kind::PING, 0, 0, &[0; 8]).unwrap_err(),
        Reason::PROTOCOL_ERROR
    );
}

#[test]
fn an_endless_header_block_is_cut_off() {
    let mut c = greeted();
    feed(&mut c, kind::HEADERS, 0x1, 1, &GET).unwrap();
    let fragment = vec![0u8; MAX_FRAME];
    let err = loop {
        if let Err(e) = feed(&mut c, kind::CONTINUATION, 0, 1, &fragment) {
            break e;
        }
    };
    assert_eq!(err, Reason::ENHANCE_YOUR_CALM);
}

#[test]
fn streams_reset_before_their_answer_end_the_connection_past_the_limit() {
    let mut c = greeted();
    let mut last = Ok(None);
    for i in 0..=MAX_EARLY_RESETS {
        let id = 1 + 2 * i;
        feed(&mut c, kind::HEADERS, 0x5, id, &GET).unwrap();
        last = feed(&mut c, kind::RST_STREAM, 0, id, &8u32.to_be_bytes());
    }
    assert_eq!(last.unwrap_err(), Reason::ENHANCE_YOUR_CALM);
}

#[test]
fn answers_wait_on_both_windows_and_settings_move_them() {
    let mut c = greeted();
    feed(&mut c, kind::SETTINGS, 0, 0, &[0, 4, 0, 0, 0, 3]).unwrap();
    feed(&mut c, kind::HEADERS, 0x5, 1, &GET).unwrap();
    c.send_head(1, &[0x88], false);
    assert_eq!(c.capacity(1), 3);
    c.send_data(1, b"abc", false);
    assert_eq!(c.capacity(1), 0);
    // Down to 2: the window is -1; an update of 2 gives one byte.
    feed(&mut c, kind::SETTINGS, 0, 0, &[0, 4, 0, 0, 0, 2]).unwrap();
    feed(&mut c, kind::WINDOW_UPDATE, 0, 1, &2u32.to_be_bytes()).unwrap();
    assert_eq!(c.capacity(1), 1);
    let over = ((1u32 << 31) - 1).to_be_bytes();
    feed(&mut c, kind::WINDOW_UPDATE, 0, 1, &over).unwrap();
    let frames = written(&mut c);
    let rst = frames.iter().find(|f| f.0 == kind::RST_STREAM).unwrap();
    assert_eq!(rst.3, Reason::FLOW_CONTROL_ERROR.0.to_be_bytes());
}

#[test]
fn a_graceful_close_takes_two_goaways_around_a_ping() {
    let mut c = greeted();
    feed(&mut c, kind::HEADERS, 0x5, 1, &GET).unwrap();
    c.close_gracefully();
    let frames = written(&mut c);
    assert_eq!(frames[0].0, kind::GOAWAY);
    assert_eq!(frames[0].3[..4], ((1u32 << 31) - 1).to_be_bytes());
    assert_eq!(frames[1].0, kind::PING);
    // A stream opened before the PING's answer is still taken.
    assert!(feed(&mut c, kind::HEADERS, 0x5, 3, &GET).unwrap().is_some());
    feed(&mut c, kind::PING, 0x1, 0, &DRAIN_PING).unwrap();
    let frames = written(&mut c);
    assert_eq!(frames[0].0, kind::GOAWAY);
    assert_eq!(frames[0].3[..4], 3u32.to_be_bytes());
    assert!(feed(&mut c, kind::HEADERS, 0x5, 5, &GET).unwrap().is_none());
    assert!(!c.is_done());
    c.send_head(1, &[0x88], true);
    c.send_head(3, &[0x88], true);
    assert!(c.is_done());
}

#[test]
fn an_extended_connect_gets_501_and_a_header_list_too_large_431() {
    let mut c = greeted();
    // :method CONNECT, :protocol websocket, :scheme https, :path /, :authority a.
    let mut ws = vec![0x02, 7];
    ws.extend_from_slice(b"CONNECT");
    ws.extend([0x00, 9]);
    ws.extend_from_slice(b":protocol");
    ws.push(9);
    ws.extend_from_slice(b"websocket");
    ws.extend([0x87, 0x84, 0x41, 0x01, b'a']);
    assert!(feed(&mut c, kind::HEADERS, 0x5, 1, &ws).unwrap().is_none());
    let frames = written(&mut c);
    assert_eq!(frames[0].0, kind::HEADERS);
    let mut d = loona_hpack::Decoder::new();
    assert_eq!(d.decode(&frames[0].3).unwrap()[0].1, b"501");
    let mut c: Conn<()> = Conn::new(100);
    feed(&mut c, kind::SETTINGS, 0, 0, &[]).unwrap();
    c.out.clear();
    let mut big = GET.to_vec();
    big.extend([0x00, 1, b'x', 100]);
    big.extend([b'y'; 100]);
    assert!(feed(&mut c, kind::HEADERS, 0x5, 1, &big).unwrap().is_none());
    let frames = written(&mut c);
    assert_eq!(d.decode(&frames[0].3).unwrap()[0].1, b"431");
}

#[test]
fn a_flood_of_pings_or_settings_never_written_out_is_cut_off() {
    let mut c = greeted();
    for _ in 0..MAX_ACKS_OWED {
        feed(&mut c, kind::PING, 0, 0, &[1; 8]).unwrap();
    }
    // Written out: the count starts again.
    c.written();
    for _ in 0..MAX_ACKS_OWED - 1 {
        feed(&mut c, kind::SETTINGS, 0, 0, &[]).unwrap();
    }
    feed(&mut c, kind::PING, 0, 0, &[1; 8]).unwrap();
    assert_eq!(
        feed(&mut c, kind::SETTINGS, 0, 0, &[]).unwrap_err(),
        Reason::ENHANCE_YOUR_CALM
    );
}

//! The keeper's wire protocol (JSON lines on its Unix socket): a real
//! keeper reads garbage — random bytes, any JSON, nearly valid requests —
//! and must still answer `status` on the same connection afterwards (the
//! keeper guards the service: it must not go deaf or exit because of a
//! bad line). And an agent's client reads garbage from a (fake) keeper: it
//! skips what it cannot read and matches replies by id, or, on bytes that
//! are not even text, treats the keeper as lost — never a panic.

use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::sys::signal::kill;
use nix::unistd::Pid;
use proptest::prelude::*;
use putex::clock::boot_time_now;
use putex::core::agent::StopKind;
use putex::core::Token;
use putex::supervision::keeper::{
    socket_path, FromKeeper, KeeperClient, KeeperConfig, KeeperError, KeeperStatus, ToKeeper,
};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};

use crate::common::agent::KillOnDrop;

use super::{bounded, fuzz_n, json_value, mutate, mutation, runtime, text, Bytes};

/// Requests the keeper may get, nearly valid. Never `spawn-child` (it would
/// run a program) nor `shutdown` (the keeper would rightly exit).
fn request() -> impl Strategy<Value = ToKeeper> {
    let id = prop_oneof![any::<u64>(), 0u64..5];
    let deadline = prop_oneof![
        any::<u64>(),
        (0u64..2_000).prop_map(|ms| boot_time_now().as_nanos() + ms * 1_000_000),
        Just(0),
        Just(u64::MAX),
    ];
    prop_oneof![
        (
            id.clone(),
            deadline.clone(),
            prop::option::of((any::<u64>(), any::<u64>()).prop_map(|(e, r)| Token::new(e, r))),
            prop::option::of(text()),
        )
            .prop_map(|(id, deadline_ns, token, previous)| ToKeeper::Arm {
                id,
                deadline_ns,
                token,
                previous,
            }),
        (id.clone(), deadline).prop_map(|(id, deadline_ns)| ToKeeper::Extend { id, deadline_ns }),
        id.clone().prop_map(|id| ToKeeper::Disarm { id }),
        (
            id.clone(),
            prop::sample::select(vec![
                StopKind::Startup,
                StopKind::Graceful,
                StopKind::Emergency
            ]),
        )
            .prop_map(|(id, kind)| ToKeeper::Stop { id, kind }),
        (id.clone(), any::<i32>()).prop_map(|(id, signal)| ToKeeper::Signal { id, signal }),
        id.prop_map(|id| ToKeeper::Status { id }),
    ]
}

/// Garbage lines (joined with `\n`; one may hold several lines or none).
fn lines() -> impl Strategy<Value = Bytes> {
    let line = prop_oneof![
        3 => (request(), prop::collection::vec(mutation(), 1..3))
            .prop_map(|(r, ms)| mutate(&serde_json::to_vec(&r).unwrap(), &ms)),
        1 => request().prop_map(|r| serde_json::to_vec(&r).unwrap()),
        1 => json_value().prop_map(|v| serde_json::to_vec(&v).unwrap()),
        // A stop of a kind the keeper does not know: refused when read.
        1 => (any::<u64>(), text()).prop_map(|(id, kind)| {
            serde_json::to_vec(&serde_json::json!({"type": "stop", "id": id, "kind": kind})).unwrap()
        }),
        1 => prop::collection::vec(any::<u8>(), 0..48),
        1 => prop::sample::select(vec![
            &b""[..], b"\r", b"{", b"}", b"\xff\xfe", b"\xc3", b"\x00", b"null",
            br#"{"type":"status"}"#, br#"{"type":"status","id":-1}"#,
            br#"{"type":"arm","id":1,"deadline_ns":18446744073709551616}"#,
        ])
        .prop_map(<[u8]>::to_vec),
    ];
    prop::collection::vec(line, 1..6).prop_map(|ls| {
        let mut out = Vec::new();
        for l in ls {
            // What the keeper would read, line by line: nothing that
            // spawns or shuts down.
            for part in l.split(|b| *b == b'\n') {
                let dangerous = matches!(
                    serde_json::from_slice::<ToKeeper>(part),
                    Ok(ToKeeper::SpawnChild { .. } | ToKeeper::Shutdown { .. })
                );
                out.extend_from_slice(if dangerous { b"x" } else { part });
                out.push(b'\n');
            }
        }
        Bytes(out)
    })
}

fn config(dir: &Path) -> KeeperConfig {
    KeeperConfig {
        exe: PathBuf::from(env!("CARGO_BIN_EXE_putex")),
        socket: socket_path(dir, "fuzz-store", "fuzz"),
        lock: putex::store::Name::new("fuzz").unwrap(),
        node: putex::store::NodeId::new("n1").unwrap(),
        deactivate: None,
        kv_socket: None,
        stop_timeout: Duration::from_millis(200),
        emergency_timeout: Duration::from_millis(100),
        cgroup: false,
        quiet: true,
        child_stdout: false,
    }
}

/// Asks for `status` with `id` and reads until its answer.
async fn status(
    reader: &mut BufReader<tokio::net::unix::OwnedReadHalf>,
    writer: &mut tokio::net::unix::OwnedWriteHalf,
    id: u64,
) -> Result<KeeperStatus, String> {
    let ask = format!(
        "{}\n",
        serde_json::to_string(&ToKeeper::Status { id }).unwrap()
    );
    writer
        .write_all(ask.as_bytes())
        .await
        .map_err(|e| format!("writing status: {e}"))?;
    let mut line = Vec::new();
    loop {
        line.clear();
        let n = reader
            .read_until(b'\n', &mut line)
            .await
            .map_err(|e| format!("reading: {e}"))?;
        if n == 0 {
            return Err("the keeper closed the connection".into());
        }
        if let Ok(FromKeeper::Status { id: got, status }) = serde_json::from_slice(&line) {
            if got == id {
                return Ok(status);
            }
        }
    }
}

#[test]
fn fuzz_keeper_socket() {
    let rt = runtime();
    let dir = tempfile::tempdir().unwrap();
    let (client, pid) = rt.block_on(async {
        let (client, adopted) = KeeperClient::spawn_or_adopt(&config(dir.path()))
            .await
            .unwrap();
        assert!(!adopted);
        let pid = client.status().await.unwrap().pid;
        (client, pid)
    });
    let _kill = KillOnDrop(pid);
    // Our own connection replaces the client's (one agent at a time). It
    // stays open: a keeper whose agent leaves while nothing is armed exits,
    // as it should.
    let conn = rt.block_on(async {
        let s = UnixStream::connect(&config(dir.path()).socket)
            .await
            .unwrap();
        let (r, w) = s.into_split();
        tokio::sync::Mutex::new((BufReader::new(r), w))
    });
    drop(client);
    let next = std::sync::atomic::AtomicU64::new(1 << 62);
    // Cases after a failure fail too (the connection is gone), so proptest
    // cannot shrink: the first failing input is the one to look at.
    let first = std::sync::Mutex::new(None::<Bytes>);
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        fuzz_n("keeper socket", super::cases(), lines(), |garbage| {
            let result = rt.block_on(async {
                let mut guard = conn.lock().await;
                let (reader, writer) = &mut *guard;
                writer
                    .write_all(&garbage.0)
                    .await
                    .map_err(|e| TestCaseError::fail(format!("writing: {e}")))?;
                let id = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let st = bounded("keeper status", status(reader, writer, id))
                    .await
                    .map_err(TestCaseError::fail)?;
                prop_assert_eq!(st.pid, pid);
                prop_assert!(kill(Pid::from_raw(pid), None).is_ok(), "the keeper died");
                Ok(())
            });
            if result.is_err() {
                first.lock().unwrap().get_or_insert(garbage);
            }
            result
        })
    }));
    if let Err(e) = result {
        panic!(
            "{}; the first input that failed: {:?}",
            e.downcast_ref::<String>().map_or("", String::as_str),
            first.lock().unwrap()
        );
    }
}

/// Replies an agent's client may get, nearly valid; none answers the
/// client's own request (id 1) — that one is sent last.
fn replies() -> impl Strategy<Value = Vec<Bytes>> {
    let reply = prop_oneof![
        (2u64..10).prop_map(|id| FromKeeper::Ok { id }),
        (2u64..10, text()).prop_map(|(id, reason)| FromKeeper::Refused { id, reason }),
        (any::<bool>()).prop_map(|ok| FromKeeper::Fired { ok }),
        (
            prop::option::of(any::<i32>()),
            prop::option::of(any::<i32>())
        )
            .prop_map(|(code, signal)| FromKeeper::ChildExited { code, signal }),
        (2u64..10, text()).prop_map(|(id, message)| FromKeeper::Error { id, message }),
    ];
    let line = prop_oneof![
        3 => (reply.clone(), prop::collection::vec(mutation(), 1..3))
            .prop_map(|(r, ms)| mutate(&serde_json::to_vec(&r).unwrap(), &ms)),
        1 => reply.prop_map(|r| serde_json::to_vec(&r).unwrap()),
        1 => json_value().prop_map(|v| serde_json::to_vec(&v).unwrap()),
        // A stop of a kind the keeper does not know: refused when read.
        1 => (any::<u64>(), text()).prop_map(|(id, kind)| {
            serde_json::to_vec(&serde_json::json!({"type": "stop", "id": id, "kind": kind})).unwrap()
        }),
        1 => prop::collection::vec(any::<u8>(), 0..32),
    ];
    prop::collection::vec(line, 0..5).prop_map(|ls| {
        ls.into_iter()
            .flat_map(|l| {
                l.split(|b| *b == b'\n')
                    .map(|part| {
                        // Nothing else answers request 1.
                        match serde_json::from_slice::<FromKeeper>(part) {
                            Ok(FromKeeper::Ok { id: 1 })
                            | Ok(FromKeeper::Refused { id: 1, .. })
                            | Ok(FromKeeper::Spawned { id: 1, .. })
                            | Ok(FromKeeper::Stopped { id: 1, .. })
                            | Ok(FromKeeper::Status { id: 1, .. })
                            | Ok(FromKeeper::Error { id: 1, .. }) => Bytes(b"x".to_vec()),
                            _ => Bytes(part.to_vec()),
                        }
                    })
                    .collect::<Vec<_>>()
            })
            .collect()
    })
}

fn a_status() -> KeeperStatus {
    KeeperStatus {
        pid: 4242,
        lock: "fuzz".into(),
        now_ns: 1,
        deadline_ns: None,
        fired: false,
        mode: "subreaper".into(),
        child: None,
        stopping: false,
        snapshot: None,
    }
}

#[test]
fn fuzz_keeper_replies() {
    let rt = runtime();
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("fake.sock");
    fuzz_n("keeper replies", super::cases(), replies(), |garbage| {
        rt.block_on(async {
            let _ = std::fs::remove_file(&socket);
            let listener = UnixListener::bind(&socket).unwrap();
            let lines = garbage.clone();
            // A fake keeper: reads the status request, answers with
            // garbage first, then the reply.
            let fake = tokio::spawn(async move {
                let (s, _) = listener.accept().await.unwrap();
                let (r, mut w) = s.into_split();
                let mut r = BufReader::new(r);
                let mut ask = String::new();
                r.read_line(&mut ask).await.unwrap();
                for l in &lines {
                    let _ = w.write_all(&l.0).await;
                    let _ = w.write_all(b"\n").await;
                }
                let reply = FromKeeper::Status {
                    id: 1,
                    status: a_status(),
                };
                let mut reply = serde_json::to_vec(&reply).unwrap();
                reply.push(b'\n');
                let _ = w.write_all(&reply).await;
                // Keep the connection open until the client is done.
                let mut rest = String::new();
                let _ = r.read_line(&mut rest).await;
            });
            let adopted = bounded("adopt", KeeperClient::adopt(&socket)).await;
            fake.abort();
            let not_text = garbage.iter().any(|l| std::str::from_utf8(&l.0).is_err());
            match adopted {
                Ok(Some(c)) => {
                    prop_assert!(!not_text, "read past bytes that are not text");
                    drop(c);
                }
                Err(KeeperError::Lost) => {
                    prop_assert!(not_text, "lost on text lines only")
                }
                other => prop_assert!(false, "{:?}", other.map(|c| c.is_some())),
            }
            Ok(())
        })
    });
}

/// r43: the keeper read its socket as UTF-8 lines; a line that was not
/// UTF-8 ended its reader as if the agent had hung up. The keeper dropped
/// the connection (the agent took it for a dead keeper) and, with nothing
/// armed, exited. Found by `fuzz_keeper_socket`.
#[test]
fn r43_a_line_that_is_not_text_is_skipped() {
    let rt = runtime();
    let dir = tempfile::tempdir().unwrap();
    rt.block_on(async {
        let (client, _) = KeeperClient::spawn_or_adopt(&config(dir.path()))
            .await
            .unwrap();
        let pid = client.status().await.unwrap().pid;
        let _kill = KillOnDrop(pid);
        let s = UnixStream::connect(&config(dir.path()).socket)
            .await
            .unwrap();
        drop(client);
        let (r, mut w) = s.into_split();
        let mut r = BufReader::new(r);
        w.write_all(b"\xff\xfe\n{\"type\":\"status\",\"id\":\"\xc3\"}\n")
            .await
            .unwrap();
        let st = bounded("status", status(&mut r, &mut w, 7)).await.unwrap();
        assert_eq!(st.pid, pid);
    });
}

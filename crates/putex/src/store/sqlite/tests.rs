//! Unit tests of the SQLite backend.

use super::*;

const T: Duration = Duration::from_secs(5);

/// SQLite names the -wal and -shm after the database's real path: a
/// store opened through a symbolic link checks the files beside the
/// target, and a file renamed over the path is another file.
#[tokio::test]
async fn files_through_a_symlink_and_a_file_renamed_over_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let real = dir.path().join("real.db");
    let link = dir.path().join("store.db");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    let s = SqliteStore::open(link.clone()).await.unwrap();
    let t = s.create("lock.pg", b"x", T).await.unwrap();
    assert!(with_suffix(&real, "-wal").exists());
    assert!(!with_suffix(&link, "-wal").exists());
    let files = &s.inner.files.files;
    assert_eq!(files[0].0, link);
    assert_eq!(files[1].0, with_suffix(&real, "-wal"));

    let other = SqliteStore::open(dir.path().join("other.db"))
        .await
        .unwrap();
    drop(other);
    std::fs::rename(dir.path().join("other.db"), &real).unwrap();
    match s.update("lock.pg", b"y", t, T).await {
        Err(StoreError::Unknown { reason, .. }) => assert!(
            reason.contains(&link.display().to_string()) && reason.contains("another file"),
            "{reason}"
        ),
        other => panic!("{other:?}"),
    }
}

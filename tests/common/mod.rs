//! What several integration tests share.

use std::path::{Path, PathBuf};

/// The DTR authors' 8 logs, sorted by name (see [`prototype_traces`]).
pub fn prototype_logs() -> Option<Vec<PathBuf>> {
    let dir = prototype_traces()?;
    let mut logs: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("the traces directory is readable")
        .map(|entry| entry.expect("a directory entry").path())
        .filter(|path| path.extension().is_some_and(|e| e == "log"))
        .collect();
    logs.sort();
    assert_eq!(logs.len(), 8, "the DTR authors' logs in {}", dir.display());
    Some(logs)
}

/// The authors' log whose file name starts with `prefix` (see
/// [`prototype_logs`]).
#[allow(dead_code)] // not every test crate reads one log
pub fn prototype_log(prefix: &str) -> Option<PathBuf> {
    let logs = prototype_logs()?;
    let log = logs
        .into_iter()
        .find(|p| p.file_name().unwrap().to_string_lossy().starts_with(prefix))
        .unwrap_or_else(|| panic!("no log named {prefix}…"));
    Some(log)
}

/// The directory of the DTR authors' logs: `DTR_PROTOTYPE_TRACES`, else
/// `../shared/traces/dtr-prototype` beside the project. A user's clone does
/// not have them: then the test says it skipped. Under CI (`CI=true`),
/// where they must be, their absence fails the test.
pub fn prototype_traces() -> Option<PathBuf> {
    let dir = std::env::var_os("DTR_PROTOTYPE_TRACES")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/traces/dtr-prototype")
        });
    if dir.join("reference").is_dir() {
        return Some(dir);
    }
    let why = format!(
        "the DTR authors' logs are not in {} (set DTR_PROTOTYPE_TRACES)",
        dir.display()
    );
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("CI=true, but {why}");
    }
    eprintln!("SKIPPED: {why}");
    None
}

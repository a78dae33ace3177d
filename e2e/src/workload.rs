//! `csi-test-driver app`: the workload of the e2e pods that use a volume
//! (the images have no shell). It proves the volume works from inside a
//! container and leaves evidence a test can read on the host.
//!
//! - `--dir D`: writes `--text` to `D/<file>`, reads it back, then appends
//!   `<n> <unix ms>` to `D/counter` every `--interval-ms`, so a test can
//!   measure any pause of the volume (an upgrade of the driver must not
//!   cause one).
//! - `--device P`: writes `--text` at offset 0 of a raw block device, syncs,
//!   reads it back, then waits.
//!
//! It exits on SIGTERM (as PID 1 of a container it must handle it itself).

use std::fs::OpenOptions;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Flags of `csi-test-driver app`.
#[derive(Debug, clap::Args)]
pub struct AppArgs {
    /// A mounted filesystem volume.
    #[arg(long, conflicts_with = "device", required_unless_present = "device")]
    pub dir: Option<PathBuf>,
    /// A raw block device.
    #[arg(long)]
    pub device: Option<PathBuf>,
    /// File name inside `--dir`.
    #[arg(long, default_value = "hello.txt")]
    pub file: String,
    /// What to write.
    #[arg(long)]
    pub text: String,
    /// Period of the counter lines.
    #[arg(long, default_value_t = 100)]
    pub interval_ms: u64,
}

/// Runs the workload until SIGTERM; failure to write or read back exits 1.
pub fn run(args: &AppArgs) -> ExitCode {
    let result = match (&args.dir, &args.device) {
        (Some(dir), _) => write_file(&dir.join(&args.file), &args.text),
        (None, Some(dev)) => write_device(dev, &args.text),
        (None, None) => Err("--dir or --device is required".to_string()),
    };
    if let Err(e) = result {
        eprintln!("app: {e}");
        return ExitCode::FAILURE;
    }
    println!("app: wrote and read back {:?}", args.text);
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("app: runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let counter = args.dir.as_ref().map(|d| d.join("counter"));
    let interval = Duration::from_millis(args.interval_ms.max(1));
    runtime.block_on(async move {
        let Ok(mut term) =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        else {
            eprintln!("app: cannot handle SIGTERM");
            return ExitCode::FAILURE;
        };
        let mut n: u64 = 0;
        loop {
            if let Some(path) = &counter {
                n += 1;
                if let Err(e) = append_line(path, n) {
                    // Keep going: the gap in the file is what a test sees.
                    eprintln!("app: counter {}: {e}", path.display());
                }
            }
            tokio::select! {
                _ = term.recv() => return ExitCode::SUCCESS,
                _ = tokio::time::sleep(interval) => {}
            }
        }
    })
}

fn write_file(path: &Path, text: &str) -> Result<(), String> {
    let err = |what: &str, e: std::io::Error| format!("{what} {}: {e}", path.display());
    let mut f = std::fs::File::create(path).map_err(|e| err("creating", e))?;
    f.write_all(text.as_bytes())
        .and_then(|()| f.sync_all())
        .map_err(|e| err("writing", e))?;
    let back = std::fs::read_to_string(path).map_err(|e| err("reading", e))?;
    if back != text {
        return Err(format!("{} holds {back:?}, wrote {text:?}", path.display()));
    }
    Ok(())
}

fn write_device(path: &Path, text: &str) -> Result<(), String> {
    let err = |what: &str, e: std::io::Error| format!("{what} {}: {e}", path.display());
    let mut f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map_err(|e| err("opening", e))?;
    f.write_all(text.as_bytes())
        .and_then(|()| f.sync_all())
        .map_err(|e| err("writing", e))?;
    let mut back = vec![0u8; text.len()];
    f.seek(SeekFrom::Start(0))
        .and_then(|_| f.read_exact(&mut back))
        .map_err(|e| err("reading", e))?;
    if back != text.as_bytes() {
        return Err(format!("{} holds other bytes than written", path.display()));
    }
    Ok(())
}

fn append_line(path: &Path, n: u64) -> std::io::Result<()> {
    let ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    let mut f = OpenOptions::new().create(true).append(true).open(path)?;
    writeln!(f, "{n} {ms}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_is_written_read_back_and_the_counter_appends() {
        let dir = tempfile::tempdir().unwrap();
        write_file(&dir.path().join("f"), "abc").unwrap();
        assert_eq!(
            std::fs::read_to_string(dir.path().join("f")).unwrap(),
            "abc"
        );
        let c = dir.path().join("counter");
        append_line(&c, 1).unwrap();
        append_line(&c, 2).unwrap();
        let text = std::fs::read_to_string(&c).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2);
        assert!(lines[1].starts_with("2 "), "{text}");
    }

    #[test]
    fn a_missing_directory_is_an_error_not_a_panic() {
        let e = write_file(Path::new("/nonexistent-dir/x"), "a").unwrap_err();
        assert!(e.contains("/nonexistent-dir/x"), "{e}");
    }
}

//! Running `csi-test-driver` as a child process in tests: start, wait until
//! it answers Probe, `kill -9`, restart on the same socket and state dir.

use std::path::{Path, PathBuf};
use std::time::Duration;

use csiops_proto::client::CsiClient;
use csiops_proto::csi::v1::ProbeRequest;

use super::service::RECEIVED;
use super::state::{load_state, State};
use crate::process::ManagedProcess;
use crate::{Error, Result};

/// How long [`TestDriverProcess::start`] waits for the first Probe.
pub const READY_TIMEOUT: Duration = Duration::from_secs(15);

/// The `csi-test-driver` binary: `CSIOPS_TEST_DRIVER_BIN`, else the newest
/// `target/{debug,release}/csi-test-driver`. Tests of this package should
/// pass `env!("CARGO_BIN_EXE_csi-test-driver")` instead.
pub fn test_driver_bin() -> Result<PathBuf> {
    crate::bins::workspace_bin("csi-test-driver", "CSIOPS_TEST_DRIVER_BIN")
}

/// One `csi-test-driver` child process (killed with the test, see
/// [`ManagedProcess`]). Output is appended to `log`, across restarts.
#[derive(Debug)]
pub struct TestDriverProcess {
    bin: PathBuf,
    args: Vec<String>,
    socket: PathBuf,
    state_dir: PathBuf,
    log: PathBuf,
    proc: Option<ManagedProcess>,
}

impl TestDriverProcess {
    /// Starts `bin --endpoint <socket> --state-dir <state_dir> <args…>` and
    /// waits until Probe answers. `args` should include `--nodeid=…`.
    pub async fn start(
        bin: &Path,
        socket: &Path,
        state_dir: &Path,
        args: &[&str],
        log: &Path,
    ) -> Result<TestDriverProcess> {
        let mut all = vec![
            format!("--endpoint={}", socket.display()),
            format!("--state-dir={}", state_dir.display()),
        ];
        all.extend(args.iter().map(|a| a.to_string()));
        let mut p = TestDriverProcess {
            bin: bin.to_path_buf(),
            args: all,
            socket: socket.to_path_buf(),
            state_dir: state_dir.to_path_buf(),
            log: log.to_path_buf(),
            proc: None,
        };
        p.spawn().await?;
        Ok(p)
    }

    async fn spawn(&mut self) -> Result<()> {
        let mut proc = ManagedProcess::spawn("csi-test-driver", &self.bin, &self.args, &self.log)?;
        let deadline = tokio::time::Instant::now() + READY_TIMEOUT;
        loop {
            proc.check_running()?;
            if let Ok(csi) = CsiClient::connect(
                self.socket.to_str().unwrap_or_default(),
                Duration::from_secs(2),
            )
            .await
            {
                if csi.identity().probe(ProbeRequest {}).await.is_ok() {
                    break;
                }
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(Error::Other(format!(
                    "csi-test-driver did not answer Probe on {} within {READY_TIMEOUT:?}\n{}",
                    self.socket.display(),
                    proc.log_tail(40)
                )));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.proc = Some(proc);
        Ok(())
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    pub fn state_dir(&self) -> &Path {
        &self.state_dir
    }

    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// The pid, while running.
    pub fn pid(&self) -> Option<u32> {
        self.proc.as_ref().map(ManagedProcess::pid)
    }

    /// A client with a 10 s default deadline.
    pub async fn client(&self) -> Result<CsiClient> {
        CsiClient::connect(
            self.socket.to_str().unwrap_or_default(),
            Duration::from_secs(10),
        )
        .await
        .map_err(|e| Error::Other(e.to_string()))
    }

    /// The persisted state, read from the file (no gRPC).
    pub fn state(&self) -> std::io::Result<State> {
        load_state(&self.state_dir)
    }

    /// `kill -9` and reap. The socket file stays behind, as after a crash.
    pub fn kill9(&mut self) {
        if let Some(mut p) = self.proc.take() {
            p.kill9();
        }
    }

    /// SIGTERM and wait for the exit (SIGKILL after `grace`).
    pub fn stop(&mut self, grace: Duration) {
        if let Some(mut p) = self.proc.take() {
            p.terminate(grace);
        }
    }

    /// Starts the process again with the same arguments (after
    /// [`kill9`](Self::kill9) or [`stop`](Self::stop); kills it first if it runs).
    pub async fn restart(&mut self) -> Result<()> {
        self.kill9();
        self.spawn().await
    }

    /// The log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Whether the driver has received a `method` call whose redacted
    /// request contains `needle` (its [`RECEIVED`] log line, written when
    /// the call's detached work begins). From then on the call completes
    /// even if the caller is killed, so tests that kill a caller mid-call
    /// wait for this first.
    pub fn received(&self, method: &str, needle: &str) -> bool {
        self.received_count(method, needle) > 0
    }

    /// How many `method` calls whose redacted request contains `needle`
    /// the driver has received so far (see [`received`](Self::received)).
    pub fn received_count(&self, method: &str, needle: &str) -> usize {
        let prefix = format!(" {RECEIVED} method=\"{method}\" ");
        self.log()
            .lines()
            .filter(|l| l.contains(&prefix) && l.contains(needle))
            .count()
    }
}

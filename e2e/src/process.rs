//! Child processes that can never outlive the test process.
//!
//! Three mechanisms, each covering a different way the test can end:
//! - `Drop`/`terminate_all`: the normal path and panics (unwinding). SIGTERM
//!   to the child's process group, SIGKILL after a grace period, then reap.
//! - `PR_SET_PDEATHSIG(SIGKILL)`: the test process itself is SIGKILLed (or
//!   aborts), so no destructor runs; the kernel kills the children.
//! - its own process group: a terminal's Ctrl-C does not hit the children
//!   half-way through our orderly shutdown, and `kill(-pgid)` also reaches
//!   anything a child forked.
//!
//! PDEATHSIG fires when the *thread* that forked the child exits, not the
//! process. Tokio threads come and go (the blocking pool reaps idle threads,
//! each `#[tokio::test]` has its own runtime), so every child is forked from
//! one dedicated thread that lives as long as the process.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::error::{io, Error, Result};

/// How long a process gets between SIGTERM and SIGKILL.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(5);

/// A running child whose output goes to a log file.
#[derive(Debug)]
pub struct ManagedProcess {
    name: String,
    child: Child,
    log: PathBuf,
    /// Set once reaped, so the status can still be reported.
    exited: Option<std::process::ExitStatus>,
    /// Terminated and its group SIGKILLed: never signal the (possibly
    /// reused) pid again.
    done: bool,
}

impl ManagedProcess {
    /// Starts `program args…` with stdout and stderr appended to `log`.
    pub fn spawn(
        name: &str,
        program: &Path,
        args: &[String],
        log: &Path,
    ) -> Result<ManagedProcess> {
        Self::spawn_with_env(name, program, args, &[], log)
    }

    /// [`ManagedProcess::spawn`] with extra environment variables.
    pub fn spawn_with_env(
        name: &str,
        program: &Path,
        args: &[String],
        env: &[(&str, &str)],
        log: &Path,
    ) -> Result<ManagedProcess> {
        let out = OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .map_err(io("opening log", log))?;
        let err = out.try_clone().map_err(io("opening log", log))?;
        let mut cmd = Command::new(program);
        cmd.args(args)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0);
        // getpid() before the fork: in the child, getppid() differing from it
        // means the parent died before prctl took effect.
        let parent = std::process::id() as libc::pid_t;
        // SAFETY: the closure only calls async-signal-safe functions
        // (prctl, getppid, _exit) and allocates nothing.
        unsafe {
            cmd.pre_exec(move || {
                if libc::prctl(
                    libc::PR_SET_PDEATHSIG,
                    libc::SIGKILL as libc::c_ulong,
                    0,
                    0,
                    0,
                ) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                if libc::getppid() != parent {
                    libc::_exit(1);
                }
                Ok(())
            });
        }
        let child = spawn_on_keeper_thread(cmd).map_err(|source| Error::Spawn {
            name: name.to_string(),
            path: program.to_path_buf(),
            source,
        })?;
        tracing::debug!(name, pid = child.id(), log = %log.display(), "spawned");
        Ok(ManagedProcess {
            name: name.to_string(),
            child,
            log: log.to_path_buf(),
            exited: None,
            done: false,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// The last `lines` lines of the log.
    pub fn log_tail(&self, lines: usize) -> String {
        log_tail(&self.log, lines)
    }

    /// `Err(ProcessExited)` if the process has ended (it is reaped then).
    pub fn check_running(&mut self) -> Result<()> {
        if self.exited.is_none() {
            self.exited = self.child.try_wait().ok().flatten();
        }
        match self.exited {
            None => Ok(()),
            Some(status) => Err(Error::ProcessExited {
                name: self.name.clone(),
                status: status.to_string(),
                log: self.log.clone(),
                tail: self.log_tail(40),
            }),
        }
    }

    /// `kill -9` (no grace, as a crash) and reap.
    pub fn kill9(&mut self) {
        // SAFETY: kill has no memory-safety preconditions.
        unsafe {
            libc::kill(self.pid() as libc::pid_t, libc::SIGKILL);
        }
        self.terminate(Duration::ZERO);
    }

    /// SIGTERM, SIGKILL after `grace`, reaped on return.
    pub fn terminate(&mut self, grace: Duration) {
        terminate_all(std::slice::from_mut(self), grace);
    }

    fn signal_group(&self, sig: libc::c_int) {
        // The child leads its own group (process_group(0)), so pgid == pid.
        // SAFETY: kill has no memory-safety preconditions.
        unsafe {
            libc::kill(-(self.child.id() as libc::pid_t), sig);
        }
    }
}

impl Drop for ManagedProcess {
    fn drop(&mut self) {
        self.terminate(DEFAULT_GRACE);
    }
}

/// Stops all processes concurrently: SIGTERM to each group, wait up to
/// `grace` for all of them, SIGKILL what is left, reap everything.
pub fn terminate_all(procs: &mut [ManagedProcess], grace: Duration) {
    let mut procs: Vec<&mut ManagedProcess> = procs.iter_mut().filter(|p| !p.done).collect();
    for p in procs.iter_mut() {
        if p.exited.is_none() {
            p.signal_group(libc::SIGTERM);
        }
    }
    let end = Instant::now() + grace;
    loop {
        let mut running = false;
        for p in procs.iter_mut() {
            if p.exited.is_none() {
                p.exited = p.child.try_wait().ok().flatten();
                running |= p.exited.is_none();
            }
        }
        if !running || Instant::now() >= end {
            break;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    for p in procs.iter_mut() {
        // Also after a clean exit: whatever the child forked into its group goes too.
        p.signal_group(libc::SIGKILL);
        if p.exited.is_none() {
            if let Ok(status) = p.child.wait() {
                p.exited = Some(status);
            }
            tracing::debug!(name = %p.name, "killed after grace period");
        }
        p.done = true;
    }
}

/// User + system CPU seconds of a process so far, from `/proc/<pid>/stat`.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command (which may contain spaces) start at state.
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    clock_ticks().map(|hz| ticks / hz)
}

fn clock_ticks() -> Option<f64> {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    (hz > 0.0).then_some(hz)
}

/// Busy and idle CPU seconds of all cores together so far, from the `cpu`
/// line of `/proc/stat` (busy: user, nice, system, irq, softirq, steal;
/// idle: idle and iowait).
pub fn machine_cpu_seconds() -> Option<(f64, f64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    machine_cpu_from(stat.lines().next()?).and_then(|(busy, idle)| {
        let hz = clock_ticks()?;
        Some((busy / hz, idle / hz))
    })
}

/// (busy, idle) ticks of a `/proc/stat` `cpu` line.
fn machine_cpu_from(line: &str) -> Option<(f64, f64)> {
    let mut fields = line.split_whitespace();
    if fields.next()? != "cpu" {
        return None;
    }
    let t: Vec<f64> = fields.map_while(|f| f.parse().ok()).collect();
    let at = |i: usize| t.get(i).copied().unwrap_or(0.0);
    (t.len() >= 4).then(|| {
        let busy = at(0) + at(1) + at(2) + at(5) + at(6) + at(7);
        (busy, at(3) + at(4))
    })
}

/// Where CPU went between two moments of a benchmark: each named process's
/// seconds and the whole machine's busy and idle seconds.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CpuSample {
    /// (name, user + system seconds) of each process still running.
    pub processes: Vec<(String, f64)>,
    /// All cores' busy seconds.
    pub busy: f64,
    /// All cores' idle seconds.
    pub idle: f64,
}

impl CpuSample {
    /// The counters now, of `processes` (name, pid) and of the machine.
    pub fn take(processes: &[(String, u32)]) -> CpuSample {
        let (busy, idle) = machine_cpu_seconds().unwrap_or_default();
        CpuSample {
            processes: processes
                .iter()
                .filter_map(|(name, pid)| Some((name.clone(), cpu_seconds(*pid)?)))
                .collect(),
            busy,
            idle,
        }
    }

    /// What was used between `earlier` and this sample (processes in both).
    pub fn since(&self, earlier: &CpuSample) -> CpuSample {
        CpuSample {
            processes: self
                .processes
                .iter()
                .filter_map(|(name, now)| {
                    let (_, then) = earlier.processes.iter().find(|(n, _)| n == name)?;
                    Some((name.clone(), now - then))
                })
                .collect(),
            busy: self.busy - earlier.busy,
            idle: self.idle - earlier.idle,
        }
    }

    /// Adds `other`'s seconds to these, process by process (a process
    /// only `other` has is added to the list).
    pub fn add(&mut self, other: &CpuSample) {
        for (name, secs) in &other.processes {
            match self.processes.iter_mut().find(|(n, _)| n == name) {
                Some((_, t)) => *t += secs,
                None => self.processes.push((name.clone(), *secs)),
            }
        }
        self.busy += other.busy;
        self.idle += other.idle;
    }

    /// The seconds of the process named `name` (0 when it was not sampled).
    pub fn of(&self, name: &str) -> f64 {
        self.processes
            .iter()
            .find(|(n, _)| n == name)
            .map_or(0.0, |(_, s)| *s)
    }
}

/// `VmRSS` and `VmHWM` (peak) of a process, in KiB, for benchmarks.
pub fn memory_kib(pid: u32) -> Option<(u64, u64)> {
    let m = memory_detail_kib(pid)?;
    Some((m.rss, m.hwm))
}

/// A process's resident memory from `/proc/<pid>/status`, in KiB.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Memory {
    /// VmRSS: everything resident now.
    pub rss: u64,
    /// VmHWM: the peak of VmRSS.
    pub hwm: u64,
    /// RssAnon: heap, stacks and other private memory.
    pub anon: u64,
    /// RssFile: pages of mapped files (the binary's code and data).
    pub file: u64,
}

pub fn memory_detail_kib(pid: u32) -> Option<Memory> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    parse_status_memory(&status)
}

fn parse_status_memory(status: &str) -> Option<Memory> {
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
    };
    Some(Memory {
        rss: field("VmRSS:")?,
        hwm: field("VmHWM:")?,
        anon: field("RssAnon:")?,
        file: field("RssFile:")?,
    })
}

/// Whether a process with this pid is running. A zombie (exited, not yet
/// reaped, e.g. reparented to a pid 1 that never reaps) counts as dead.
pub fn pid_alive(pid: u32) -> bool {
    // SAFETY: signal 0 only checks for existence and permission.
    let r = unsafe { libc::kill(pid as libc::pid_t, 0) };
    if r != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH) {
        return false;
    }
    // /proc/<pid>/stat is "pid (comm) S ...": the state follows the last ')'.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !matches!(
            stat.rsplit_once(')')
                .and_then(|(_, rest)| rest.trim_start().chars().next()),
            Some('Z' | 'X')
        ),
        Err(_) => false,
    }
}

/// The last `lines` lines of a file (reads at most the final 64 KiB).
pub fn log_tail(path: &Path, lines: usize) -> String {
    const MAX: u64 = 64 * 1024;
    let read = || -> std::io::Result<String> {
        let mut f = File::open(path)?;
        let len = f.metadata()?.len();
        f.seek(SeekFrom::Start(len.saturating_sub(MAX)))?;
        let mut buf = Vec::new();
        f.read_to_end(&mut buf)?;
        Ok(String::from_utf8_lossy(&buf).into_owned())
    };
    match read() {
        Ok(text) => {
            let all: Vec<&str> = text.lines().collect();
            all[all.len().saturating_sub(lines)..].join("\n")
        }
        Err(e) => format!("<cannot read {}: {e}>", path.display()),
    }
}

type SpawnRequest = (Command, mpsc::Sender<std::io::Result<Child>>);

/// Forks `cmd` from the process-lifetime keeper thread (see module docs).
fn spawn_on_keeper_thread(cmd: Command) -> std::io::Result<Child> {
    static KEEPER: OnceLock<Mutex<mpsc::Sender<SpawnRequest>>> = OnceLock::new();
    let keeper = KEEPER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        std::thread::Builder::new()
            .name("csiops-e2e-spawner".into())
            .spawn(move || {
                // Never returns: the sender lives in a static.
                for (mut cmd, reply) in rx {
                    let _ = reply.send(cmd.spawn());
                }
            })
            .expect("starting the spawner thread");
        Mutex::new(tx)
    });
    let (reply_tx, reply_rx) = mpsc::channel();
    keeper
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .send((cmd, reply_tx))
        .map_err(|_| std::io::Error::other("spawner thread is gone"))?;
    reply_rx
        .recv()
        .map_err(|_| std::io::Error::other("spawner thread is gone"))?
}

/// Sends SIGTERM to `pid` and waits up to `deadline` for it to exit; `false`
/// if it is still alive then. For tests of graceful shutdown (the process is
/// not killed afterwards: its owner's drop does that).
pub async fn sigterm_and_wait(pid: u32, deadline: Duration) -> bool {
    // SAFETY: kill has no memory-safety preconditions.
    unsafe {
        libc::kill(pid as libc::pid_t, libc::SIGTERM);
    }
    crate::wait_for(deadline, Duration::from_millis(50), || async {
        (!pid_alive(pid)).then_some(())
    })
    .await
    .is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn machine_cpu_adds_busy_and_idle_fields_of_the_cpu_line() {
        // user nice system idle iowait irq softirq steal guest guest_nice
        let line = "cpu  100 5 50 1000 20 3 2 1 0 0";
        assert_eq!(machine_cpu_from(line), Some((161.0, 1020.0)));
        assert_eq!(machine_cpu_from("cpu0 1 2 3 4"), None, "one core's line");
        assert_eq!(machine_cpu_from("cpu 1 2"), None, "too few fields");
        assert!(machine_cpu_seconds().is_some_and(|(busy, idle)| busy > 0.0 && idle >= 0.0));
    }

    #[test]
    fn a_cpu_sample_since_an_earlier_one_is_the_difference_per_process() {
        let at = |a: f64, b: f64, busy: f64| CpuSample {
            processes: vec![("a".into(), a), ("b".into(), b)],
            busy,
            idle: 10.0,
        };
        let mut later = at(3.5, 2.0, 9.0);
        later.processes.push(("new".into(), 1.0));
        let d = later.since(&at(1.0, 2.0, 4.0));
        assert_eq!((d.of("a"), d.of("b"), d.of("new")), (2.5, 0.0, 0.0));
        assert_eq!((d.busy, d.idle), (5.0, 0.0));
        let mut all = d.clone();
        all.add(&at(1.0, 1.0, 1.0));
        assert_eq!((all.of("a"), all.of("b"), all.busy), (3.5, 1.0, 6.0));
        let me = CpuSample::take(&[("me".into(), std::process::id())]);
        assert_eq!(me.processes.len(), 1, "this process is sampled");
    }

    fn sh(dir: &Path, script: &str) -> ManagedProcess {
        ManagedProcess::spawn(
            "sh",
            Path::new("/bin/sh"),
            &["-c".into(), script.into()],
            &dir.join("sh.log"),
        )
        .unwrap()
    }

    #[test]
    fn terminate_kills_and_reaps() {
        let dir = tempfile::tempdir().unwrap();
        // Ignores SIGTERM, so only the SIGKILL after the grace ends it.
        let mut p = sh(
            dir.path(),
            "trap '' TERM; echo started; while :; do sleep 1; done",
        );
        let pid = p.pid();
        assert!(pid_alive(pid));
        // The trap is set before "started" is printed; signal only after that,
        // or SIGTERM could land before the shell ignores it.
        while !p.log_tail(5).contains("started") {
            p.check_running().unwrap();
            std::thread::sleep(Duration::from_millis(10));
        }
        let t = Instant::now();
        p.terminate(Duration::from_millis(300));
        assert!(t.elapsed() >= Duration::from_millis(300));
        assert!(!pid_alive(pid));
    }

    #[test]
    fn reports_early_exit_with_log_tail() {
        let dir = tempfile::tempdir().unwrap();
        let mut p = sh(dir.path(), "echo boom >&2; exit 3");
        let err = loop {
            match p.check_running() {
                Ok(()) => std::thread::sleep(Duration::from_millis(10)),
                Err(e) => break e.to_string(),
            }
        };
        assert!(err.contains("exit status: 3"), "{err}");
        assert!(err.contains("boom"), "{err}");
    }

    #[test]
    fn log_tail_keeps_last_lines() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("x.log");
        std::fs::write(&f, "a\nb\nc\nd\n").unwrap();
        assert_eq!(log_tail(&f, 2), "c\nd");
        assert_eq!(log_tail(&f, 10), "a\nb\nc\nd");
    }

    #[test]
    fn status_memory_fields_are_read_in_kib() {
        let status = "Name:\tx\nVmHWM:\t   9000 kB\nVmRSS:\t    8000 kB\nRssAnon:\t    1500 kB\nRssFile:\t    6500 kB\nRssShmem:\t 0 kB\n";
        let m = parse_status_memory(status).unwrap();
        assert_eq!(
            m,
            Memory {
                rss: 8000,
                hwm: 9000,
                anon: 1500,
                file: 6500
            }
        );
        assert_eq!(parse_status_memory("VmRSS:\t1 kB\n"), None);
        // And this process's own status parses.
        let own = memory_detail_kib(std::process::id()).unwrap();
        assert!(own.rss > 0 && own.hwm >= own.rss);
    }
}

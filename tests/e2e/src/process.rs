use std::fs::File;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// A child process killed when dropped; its output goes to a log file whose
/// tail is printed if the test is failing.
pub struct Proc {
    name: String,
    child: Option<Child>,
    log: PathBuf,
    /// Runs in a process group of its own, killed whole (a script's
    /// children must not outlive a failed test and hold its ports).
    group: bool,
}

impl Proc {
    /// Starts `program` with `args`, logging to `dir/name.log`.
    pub fn spawn(name: &str, program: &Path, args: &[String], dir: &Path) -> anyhow::Result<Proc> {
        Proc::spawn_env(name, program, args, dir, &[])
    }

    /// [`Proc::spawn`] with these environment variables too.
    pub fn spawn_env(
        name: &str,
        program: &Path,
        args: &[String],
        dir: &Path,
        env: &[(String, String)],
    ) -> anyhow::Result<Proc> {
        Proc::start(name, program, args, dir, env, false)
    }

    /// [`Proc::spawn_env`] for a script that starts processes of its own:
    /// killing it kills them all.
    pub fn spawn_script(
        name: &str,
        program: &Path,
        args: &[String],
        dir: &Path,
        env: &[(String, String)],
    ) -> anyhow::Result<Proc> {
        Proc::start(name, program, args, dir, env, true)
    }

    fn start(
        name: &str,
        program: &Path,
        args: &[String],
        dir: &Path,
        env: &[(String, String)],
        group: bool,
    ) -> anyhow::Result<Proc> {
        let log = dir.join(format!("{name}.log"));
        let out = File::create(&log)?;
        let mut command = Command::new(program);
        if group {
            command.process_group(0);
        }
        let child = command
            .args(args)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdout(out.try_clone()?)
            .stderr(out)
            .stdin(Stdio::null())
            .spawn()
            .map_err(|e| anyhow::anyhow!("cannot start {}: {e}", program.display()))?;
        Ok(Proc {
            name: name.to_string(),
            child: Some(child),
            log,
            group,
        })
    }

    /// Kills the process now (SIGKILL, like a crash) and waits for it.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            if self.group {
                let _ = Command::new("kill")
                    .args(["-KILL", "--", &format!("-{}", c.id())])
                    .status();
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Sends signal `name` (`STOP`, `CONT`...) with `kill(1)`; false when
    /// the process is gone.
    pub fn signal(&self, name: &str) -> bool {
        let Some(child) = &self.child else {
            return false;
        };
        Command::new("kill")
            .arg(format!("-{name}"))
            .arg(child.id().to_string())
            .status()
            .is_ok_and(|s| s.success())
    }

    /// The process's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The last `n` lines of [`Proc::log`].
    pub fn log_tail(&self, n: usize) -> String {
        let log = self.log();
        let tail: Vec<&str> = log.lines().rev().take(n).collect();
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    }

    /// Whether the process has ended (or was killed).
    pub fn exited(&mut self) -> bool {
        match &mut self.child {
            Some(c) => !matches!(c.try_wait(), Ok(None)),
            None => true,
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("---- last lines of {} ----", self.name);
            eprintln!("{}", self.log_tail(30));
        }
        self.kill();
    }
}

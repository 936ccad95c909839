//! The command line: flags and subcommands, and `main`.

use std::process::ExitCode;

use clap::{Command, FromArgMatches, Subcommand};
use kube_ccm_runtime::Registry;

use crate::{leader_migration, settings, startup, telemetry};

/// The whole command line; `registry` fills the help of `--cloud-provider` and `--controllers`.
pub(crate) fn command(registry: &Registry) -> Command {
    let root = Command::new(registry.binary().name().to_owned())
        .disable_version_flag(true)
        .arg(
            clap::Arg::new("version")
                .long("version")
                .value_name("true|raw")
                .num_args(0..=1)
                .require_equals(true)
                .default_missing_value("true")
                .help("--version, --version=raw prints version information and quits: `Kubernetes vX.Y.Z` with this binary's version, as upstream's components print theirs. Upstream's --version=vX.Y.Z (report another version) is refused."),
        )
        .about("A cloud-controller-manager with Kubernetes Leader Migration built in.\n\nWithout a subcommand it runs the manager: --cloud-provider is required.")
        .args_conflicts_with_subcommands(true)
        // Every flag's help under its name, as upstream prints it; column layout breaks on long names.
        .next_line_help(true)
        .max_term_width(120);
    let leader_migration = leader_migration::Command::augment_subcommands(
        Command::new("leader-migration")
            .about("Inspect, validate and generate leader-migration configuration")
            .subcommand_required(true),
    );
    settings::add_flags(root, registry).subcommand(leader_migration)
}

/// Parses the command line and runs it; the exit code is the process's.
///
/// Exit codes: 0 done; 1 failure at run time (including lost leadership, as upstream); 2 invalid
/// command line or settings.
pub fn main(registry: Registry) -> ExitCode {
    main_with(registry, None)
}

/// A subcommand a tool built on this crate adds (the demo, `crates/ccm-demo`): its clap command, and what
/// runs it with its matches and the registry.
#[doc(hidden)]
pub struct Extension {
    /// The subcommand, with its name, help and arguments.
    pub command: Command,
    /// Runs it; an error is printed as every command's is, with exit code 1.
    pub run: fn(&clap::ArgMatches, &Registry) -> anyhow::Result<ExitCode>,
}

/// [`main`] with one more subcommand.
#[doc(hidden)]
pub fn main_with(registry: Registry, extension: Option<Extension>) -> ExitCode {
    if let Err(problem) = settings::check_declared_flags(&registry) {
        eprintln!("error: {problem}");
        return ExitCode::FAILURE;
    }
    let mut command = command(&registry);
    if let Some(extension) = &extension {
        command = command.subcommand(extension.command.clone());
    }
    let matches = match command.try_get_matches() {
        Ok(matches) => matches,
        Err(error) => error.exit(),
    };
    if let Some(extension) = extension
        && let Some((name, sub)) = matches.subcommand()
        && name == extension.command.get_name()
    {
        return report((extension.run)(sub, &registry));
    }
    match matches.subcommand() {
        Some(("leader-migration", sub)) => match leader_migration::Command::from_arg_matches(sub) {
            Ok(command) => report(command.run(&registry)),
            Err(error) => error.exit(),
        },
        _ => {
            match matches
                .get_one::<String>("version")
                .map(|v| crate::version::request(v))
            {
                Some(Ok(crate::version::Request::Print)) => {
                    return print(&crate::version::line(registry.binary()));
                }
                Some(Ok(crate::version::Request::Raw)) => {
                    return print(&crate::version::raw(registry.binary()));
                }
                Some(Err(problem)) => {
                    eprintln!("error: {problem}");
                    return ExitCode::from(2);
                }
                Some(Ok(crate::version::Request::Run)) | None => {}
            }
            run_manager(&matches, &registry)
        }
    }
}

/// A command's whole answer, on stdout.
#[allow(clippy::print_stdout)]
fn print(text: &str) -> ExitCode {
    println!("{text}");
    ExitCode::SUCCESS
}

fn report(result: anyhow::Result<ExitCode>) -> ExitCode {
    result.unwrap_or_else(|error| {
        eprintln!("error: {}", describe(&error));
        ExitCode::FAILURE
    })
}

/// The error and its causes, `: `-separated, leaving out a cause whose text the message already holds
/// (many errors print their source in their own message, and `{:#}` would print it twice).
fn describe(error: &anyhow::Error) -> String {
    let mut text = error.to_string();
    for cause in error.chain().skip(1) {
        let cause = cause.to_string();
        if !text.contains(&cause) {
            text.push_str(": ");
            text.push_str(&cause);
        }
    }
    text
}

/// glibc's malloc keeps an arena per thread that allocates, and a long-running manager whose cache is
/// built by a few threads while others allocate briefly fragments them (`cargo xtask bench nodes`: the
/// resident set is lower with two arenas at the same rate; docs/benchmarks.md). So unless the operator set
/// `MALLOC_ARENA_MAX` (glibc reads it itself), the manager limits itself to two arenas with `mallopt`
/// before its runtime starts threads: in-process, so nothing the binary's `main` did first runs twice.
/// Elsewhere this does nothing.
#[allow(unsafe_code)]
fn limit_malloc_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
        // SAFETY: mallopt only sets a tunable of the allocator; it takes the allocator's own lock.
        let set = unsafe { libc::mallopt(libc::M_ARENA_MAX, 2) };
        if set != 1 {
            eprintln!("warning: cannot limit glibc's malloc to 2 arenas; running with its default");
        }
    }
}

fn run_manager(matches: &clap::ArgMatches, registry: &Registry) -> ExitCode {
    limit_malloc_arenas();
    let startup = match settings::layered_with(matches, registry)
        .map_err(|e| vec![e.to_string()])
        .and_then(|(settings, flags)| startup::validate(settings, flags, registry))
        .and_then(
            |startup| match registry.providers().check(&startup.settings.cloud_provider) {
                Ok(()) => Ok(startup),
                Err(error) => Err(vec![error.to_string()]),
            },
        ) {
        Ok(startup) => startup,
        Err(problems) => {
            for problem in problems.iter().flat_map(|p| p.lines()) {
                eprintln!("error: {problem}");
            }
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let telemetry = {
        let _inside = runtime.enter();
        telemetry::init(
            startup.settings.v,
            startup.settings.logging_format == "json",
            startup.settings.log_text_split_stream,
        )
    };
    let code = report(runtime.block_on(startup::run(startup, registry, telemetry.verbosity())));
    telemetry.shutdown();
    code
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_cause_already_in_the_message_is_not_repeated() {
        let io = std::io::Error::other("No such file or directory");
        let repeated = anyhow::Error::new(io).context("cannot read /x: No such file or directory");
        assert_eq!(
            super::describe(&repeated),
            "cannot read /x: No such file or directory"
        );
        let added = anyhow::anyhow!("disk full").context("cannot write /y");
        assert_eq!(super::describe(&added), "cannot write /y: disk full");
    }

    #[test]
    fn repeated_flags_on_the_real_command_take_the_last_value() {
        crate::settings::tests::hermetic(|| {
            let matches = super::command(&kube_ccm_runtime::Registry::new()).try_get_matches_from([
                "ccm",
                "--enable-leader-migration",
                "--enable-leader-migration=false",
            ]);
            let settings = crate::settings::layered(&matches.unwrap()).unwrap();
            assert!(!settings.enable_leader_migration);
        });
    }
}

//! The `latchkey` binary: parse flags, start logging, run one command, print its error once.
//! Every command is library code in `latchkey::cli`.

use std::process::ExitCode;

use latchkey::cli::{self, Cli, Command};
use latchkey::policy::SecretLoading;
use latchkey::reason::chain_text;

/// mimalloc: the proxy allocates and frees many small, short-lived buffers per request across
/// threads, which glibc's allocator serves markedly slower (bench/results.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let args: Cli = match cli::given::parse(std::env::args_os()) {
        Ok(args) => args,
        Err(cli::given::ParseError::Clap(e)) => e.exit(),
        Err(cli::given::ParseError::Config(problems)) => {
            for p in problems {
                eprintln!("{p}");
            }
            eprintln!("latchkey: error: the --config file does not load; nothing started");
            return ExitCode::from(2);
        }
    };
    init_logging();
    match run(args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("latchkey: error: {}", chain_text(e.as_ref()));
            ExitCode::from(1)
        }
    }
}

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}

fn run(args: Cli) -> anyhow::Result<ExitCode> {
    match args.command {
        Command::Serve(serve) => cli::serve::run(*serve),
        Command::Check {
            policies,
            format,
            no_secrets,
        } => {
            let secrets = if no_secrets {
                SecretLoading::Skip
            } else {
                SecretLoading::Read
            };
            Ok(cli::policy::check(&policies, format, secrets))
        }
        Command::Test { policies, tests } => Ok(cli::policy::test(&policies, tests.as_deref())),
        Command::Explain {
            policies,
            format,
            json,
            reach: Some(identity),
            ..
        } => Ok(cli::policy::explain_reach(
            &policies,
            &identity,
            json || format == cli::args::OutputFormat::Json,
        )),
        Command::Explain {
            policies,
            identity,
            format,
            json,
            reach: None,
            request,
            headers,
            body,
            content_type,
        } => {
            let (method, url) = cli::policy::method_and_url(&request)?;
            let json = json || format == cli::args::OutputFormat::Json;
            let carried = cli::policy::Carrying::read(&headers, body.as_deref(), content_type)?;
            cli::policy::explain(&policies, Some(&identity), json, (method, url), &carried)
        }
        Command::Ca { action } => cli::ca::run(action),
        Command::Demo { dir, listen, once } => {
            let passed = cli::demo::run(cli::demo::Options { dir, listen, once })?;
            Ok(if passed {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            })
        }
        Command::Env {
            proxy,
            ca_dir,
            format,
            no_proxy,
            install,
            root,
        } => cli::env::run(
            &proxy,
            &ca_dir,
            format,
            &no_proxy,
            install.then_some(root.as_path()),
        ),
        Command::GatewaySetup(setup) => cli::gateway_setup::run(&setup),
        Command::Approvals(args) => cli::approvals::run(args),
        Command::Sessions(args) => cli::sessions::run(args),
        Command::Health(args) => cli::health::run(args),
        Command::Audit { action } => cli::audit::run(action),
        Command::Diff(args) => cli::diff::run(&args),
        Command::Learn(args) => cli::learn::run(&args),
        Command::Completions { shell } => cli::generate::completions(shell),
        Command::Man { command } => cli::generate::man(&command),
    }
}

//! `loopwarden healthcheck`: asks a running `loopwarden run` whether it is alive or
//! ready, for container health checks in an image without curl.

use std::io::Write as _;
use std::process::ExitCode;

use clap::Args;

#[derive(Args)]
pub struct HealthcheckArgs {
    /// The endpoint to ask.
    #[arg(long, default_value = "http://127.0.0.1:9464/healthz")]
    url: String,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 3)]
    timeout_secs: u64,
}

pub fn run(args: HealthcheckArgs) -> anyhow::Result<ExitCode> {
    let url = &args.url;
    let agent = ureq::AgentBuilder::new()
        .timeout(std::time::Duration::from_secs(args.timeout_secs))
        .build();
    // ureq reports a non-2xx answer as an error carrying the response.
    match agent.get(url).call() {
        Ok(response) => {
            // What it says is for a person; its status is the answer (a closed output
            // must not make a healthy endpoint read as failing).
            let _ = writeln!(std::io::stdout().lock(), "{} {url}", response.status());
            Ok(ExitCode::SUCCESS)
        }
        Err(ureq::Error::Status(code, response)) => {
            let body = response.into_string().unwrap_or_default();
            eprintln!("{code} {url}: {}", body.trim());
            Ok(ExitCode::from(1))
        }
        Err(error) => {
            eprintln!("{url}: {error}");
            Ok(ExitCode::from(1))
        }
    }
}

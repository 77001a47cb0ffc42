use clap::Parser;
use control_plane::config::{ApiKeysCommand, Cli, Command};
use control_plane::{access, backup, server, store};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

fn main() -> anyhow::Result<()> {
    control_plane::memory::limit_arenas();
    tokio::runtime::Builder::new_multi_thread().enable_all().build()?.block_on(run())
}

async fn run() -> anyhow::Result<()> {
    let log = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        // Colours only on a terminal: agents log to files.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                // rmcp notes every MCP request's start and end at info.
                .unwrap_or_else(|_| "info,tower_http=warn,rmcp=warn".into()),
        );
    tracing_subscriber::registry()
        .with(log)
        // The console's host page shows what went wrong lately.
        .with(control_plane::recent_problems::layer())
        .init();
    match Cli::parse().command {
        Command::Serve(config) => server::serve(*config).await,
        Command::ApiKeys(ApiKeysCommand::Create { org, policy, project, storage }) => {
            let policy = policy
                .map(|json| serde_json::from_str(&json))
                .transpose()
                .map_err(|error| anyhow::anyhow!("--policy is not a policy: {error}"))?;
            let store = store::open(storage.database_url.as_deref(), &storage.data_dir).await?;
            let key = access::keys::create_bootstrap_key(
                store.as_ref(),
                &org,
                policy,
                project.as_deref(),
            )
            .await?;
            println!("{key}");
            Ok(())
        }
        Command::Backup { output, storage } => {
            let summary =
                backup::backup(&storage.data_dir, storage.database_url.as_deref(), &output).await?;
            println!(
                "wrote {} ({} bytes): the database, {} blobs{}",
                output.display(),
                summary.bytes,
                summary.blobs,
                if summary.credential_key {
                    " and the credential key"
                } else {
                    "; no credential.key (given by --credential-key: keep that key with it)"
                }
            );
            Ok(())
        }
        Command::Restore { input, data_dir } => {
            backup::restore(&input, &data_dir).await?;
            println!("restored {} into {}", input.display(), data_dir.display());
            Ok(())
        }
    }
}

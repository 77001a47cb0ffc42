use clap::Parser;
use control_plane::config::{ApiKeysCommand, Cli, Command};
use control_plane::{access, server, store};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,tower_http=warn".into()),
        )
        .with_writer(std::io::stderr)
        // Colours only on a terminal: agents log to files.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    match Cli::parse().command {
        Command::Serve(config) => server::serve(*config).await,
        Command::ApiKeys(ApiKeysCommand::Create {
            org,
            policy,
            project,
            storage,
        }) => {
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
    }
}

//! The PostgreSQL store's pool of connections: at most `SIZE`, with bounded waits, and
//! shrinking again once load is over.

use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, PoolBuilder, QueueMode, RecyclingMethod};
use tokio_postgres::NoTls;

/// Connections a PostgreSQL store keeps open at most.
const SIZE: usize = 16;
/// A pooled connection no call has used for this long is closed (looked for this often).
const IDLE_AFTER: Duration = Duration::from_secs(60);
const IDLE_CHECK: Duration = Duration::from_secs(15);

pub(super) fn open(config: &tokio_postgres::Config) -> anyhow::Result<Pool> {
    // Bounded waits: a database that stops answering fails calls (and lease renewals)
    // instead of hanging them.
    let pool = builder(config)
        .max_size(SIZE)
        .wait_timeout(Some(Duration::from_secs(10)))
        .create_timeout(Some(Duration::from_secs(5)))
        .recycle_timeout(Some(Duration::from_secs(5)))
        .build()?;
    // Detached: it ends with the pool.
    drop(close_idle_connections(&pool, IDLE_AFTER, IDLE_CHECK));
    Ok(pool)
}

fn builder(config: &tokio_postgres::Config) -> PoolBuilder {
    let manager = Manager::from_config(
        config.clone(),
        NoTls,
        ManagerConfig { recycling_method: RecyclingMethod::Fast },
    );
    // The connection returned last is handed out first: under light load the same few
    // stay busy and the others go idle, to be closed.
    Pool::builder(manager).runtime(deadpool_postgres::Runtime::Tokio1).queue_mode(QueueMode::Lifo)
}

/// Closes, every `check`, the pooled connections unused for `idle_after`: a burst of
/// load fills the pool, and a long-running server gives back what the burst took
/// (connections on both ends, their buffers and prepared statements) once it is over.
/// Ends with the pool.
fn close_idle_connections(
    pool: &Pool, idle_after: Duration, check: Duration,
) -> tokio::task::JoinHandle<()> {
    let pool = pool.weak();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(check).await;
            let Some(pool) = pool.upgrade() else { return };
            pool.retain(|_, metrics| metrics.last_used() < idle_after);
        }
    })
}

#[cfg(test)]
mod tests {
    use std::str::FromStr;

    use super::*;

    #[tokio::test]
    async fn connections_left_idle_are_closed_and_the_pool_grows_again() {
        // deploy/test.sh sets it; `cargo test` alone on a machine without PostgreSQL
        // passes over this test, and says so.
        let Ok(url) = std::env::var("TEST_DATABASE_URL") else {
            eprintln!("TEST_DATABASE_URL is not set: the pool's test needs PostgreSQL");
            return;
        };
        let config = tokio_postgres::Config::from_str(&url).expect("database URL");
        let pool = builder(&config).max_size(4).build().expect("pool");
        let check = Duration::from_millis(100);
        let reaper = close_idle_connections(&pool, Duration::from_secs(2), check);
        let use_one = || async {
            let client = pool.get().await.expect("connection");
            let row = client.query_one("SELECT pg_backend_pid()", &[]).await;
            row.expect("query").get::<_, i32>(0)
        };
        // A burst: three connections at once.
        let burst = futures::future::join_all((0..3).map(|_| pool.get())).await;
        assert_eq!(burst.into_iter().filter(Result::is_ok).count(), 3);
        assert_eq!(pool.status().size, 3);
        // One of them keeps being used; the two others are closed once idle.
        for _ in 0..30 {
            use_one().await;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(pool.status().size, 1, "{:?}", pool.status());
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(pool.status().size, 0, "{:?}", pool.status());
        // And the pool opens connections again when called.
        use_one().await;
        assert_eq!(pool.status().size, 1);
        // The reaper keeps no hold on the pool, and ends with it.
        let weak = pool.weak();
        drop(pool);
        assert!(weak.upgrade().is_none());
        tokio::time::sleep(check * 3).await;
        assert!(reaper.is_finished());
    }
}

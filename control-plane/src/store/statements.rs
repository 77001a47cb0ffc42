//! How many statements the handling of one request sent to the database, answered in
//! its `Server-Timing` header (`store;desc="N statements"`, shown by a browser's
//! developer tools): a listing whose count grows with its page size asks once per row
//! (N+1), which the console's test and bench check. Counted where every statement
//! passes (`database.rs`), in the request's own task: work a handler spawns onto
//! another task is not counted.

use std::cell::Cell;
use std::future::Future;

tokio::task_local! {
    static STATEMENTS: Cell<u32>;
}

/// Runs one request's handling; answers its output and the statements it sent.
pub async fn counting<F: Future>(handling: F) -> (F::Output, u32) {
    STATEMENTS
        .scope(Cell::new(0), async {
            let output = handling.await;
            (output, STATEMENTS.with(Cell::get))
        })
        .await
}

/// One more statement for the current request (outside a request, nothing).
pub(super) fn sent() {
    let _ = STATEMENTS.try_with(|count| count.set(count.get().saturating_add(1)));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn counts_the_statements_of_its_own_request_only() {
        sent(); // outside any request: ignored
        let ((), inner) = counting(async {
            sent();
            sent();
        })
        .await;
        assert_eq!(inner, 2);
        let ((), none) = counting(async {}).await;
        assert_eq!(none, 0);
    }
}

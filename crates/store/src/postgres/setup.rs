//! Reaching a PostgreSQL server: urls, the embedded migrations, test databases.

use futures::future::BoxFuture;
use sqlx::error::BoxDynError;
use sqlx::migrate::{Migration, MigrationSource, MigrationType};
use sqlx::postgres::PgConnectOptions;
use sqlx::{Connection, PgConnection};
use std::borrow::Cow;
use std::str::FromStr;

use crate::{Error, Result};

/// The schema, oldest first: (version, description, SQL).
const MIGRATIONS: &[(i64, &str, &str)] =
    &[(1, "store", include_str!("../../migrations/0001_store.sql"))];

/// The embedded migrations as sqlx's migrator reads them.
#[derive(Debug)]
pub(super) struct Embedded;

impl<'s> MigrationSource<'s> for Embedded {
    fn resolve(self) -> BoxFuture<'s, std::result::Result<Vec<Migration>, BoxDynError>> {
        Box::pin(async {
            Ok(MIGRATIONS
                .iter()
                .map(|&(version, description, sql)| {
                    Migration::new(
                        version,
                        Cow::Borrowed(description),
                        MigrationType::Simple,
                        Cow::Borrowed(sql),
                        false,
                    )
                })
                .collect())
        })
    }
}

pub(super) fn options(url: &str) -> Result<PgConnectOptions> {
    if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
        return Err(Error::BadUrl(url.to_string()));
    }
    Ok(PgConnectOptions::from_str(url)?)
}

/// Creates the database `name` on the server at `server_url` and returns the url of it (the
/// same url with its database replaced). For test harnesses: every test gets a database of its
/// own. `name` is lower-case letters, digits and `_`.
pub async fn create_database(server_url: &str, name: &str) -> Result<String> {
    if name.is_empty()
        || !name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
    {
        return Err(Error::BadUrl(format!("database name {name:?}")));
    }
    let mut conn = PgConnection::connect_with(&options(server_url)?).await?;
    sqlx::query(&format!("CREATE DATABASE {name}"))
        .execute(&mut conn)
        .await?;
    conn.close().await?;
    Ok(with_database(server_url, name))
}

/// `url` with its database (the path) replaced by `name`.
fn with_database(url: &str, name: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, format!("?{q}")),
        None => (url, String::new()),
    };
    let after_scheme = base.find("://").map_or(0, |i| i + 3);
    let host_end = base[after_scheme..]
        .find('/')
        .map_or(base.len(), |i| after_scheme + i);
    format!("{}/{name}{query}", &base[..host_end])
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_database_name_replaces_the_path_and_keeps_the_query() {
        let f = super::with_database;
        assert_eq!(f("postgres://u@h:5/postgres", "t1"), "postgres://u@h:5/t1");
        assert_eq!(f("postgres://u@h:5", "t1"), "postgres://u@h:5/t1");
        assert_eq!(
            f("postgresql://h/db?host=/tmp/s&user=x", "t2"),
            "postgresql://h/t2?host=/tmp/s&user=x"
        );
    }
}

//! Which paging convention a client reads. The two Kernel SDK generations read
//! `X-Next-Offset` differently: up to Python 0.67 the next request starts at
//! `X-Next-Offset` plus the items received; from Python 0.68 (and in the TypeScript SDK)
//! it is the next page's absolute start, with 0 on the last page. The SDKs say who they
//! are in `X-Stainless-Lang` and `X-Stainless-Package-Version`; clients that do not say
//! get today's convention.

use std::convert::Infallible;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue};

use super::error::ApiError;

/// A page of a list, unless asked otherwise, and the most it may hold.
pub const DEFAULT_LIST_LIMIT: u32 = 20;
pub const MAX_LIST_LIMIT: u32 = 100;

/// The first Python SDK version that reads `X-Next-Offset` as an absolute start.
const PYTHON_ABSOLUTE_OFFSETS_SINCE: (u64, u64) = (0, 68);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Paging {
    /// `X-Next-Offset` is the offset of the page just answered.
    Legacy,
    /// `X-Next-Offset` is where the next page starts, 0 after the last.
    Current,
}

impl Paging {
    pub fn of(headers: &HeaderMap) -> Self {
        let header = |name: &str| headers.get(name).and_then(|value| value.to_str().ok());
        let is_python = header("x-stainless-lang") == Some("python");
        let version = header("x-stainless-package-version").and_then(|version| {
            let mut parts = version.trim().split('.').map(|part| part.parse::<u64>().ok());
            Some((parts.next()??, parts.next()??))
        });
        match version {
            Some(version) if is_python && version < PYTHON_ABSOLUTE_OFFSETS_SINCE => Self::Legacy,
            _ => Self::Current,
        }
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Paging {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Infallible> {
        Ok(Self::of(&parts.headers))
    }
}

/// `X-Has-More` and `X-Next-Offset` of a page of a list, in the convention of the
/// client's SDK generation: with them its auto-paging returns each item exactly once.
pub fn page_headers(paging: Paging, offset: u32, returned: usize, has_more: bool) -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert("x-has-more", HeaderValue::from_static(if has_more { "true" } else { "false" }));
    let next_offset = match (paging, has_more) {
        // The offset of the page just answered: the client adds what it received.
        (Paging::Legacy, true) => Some(u64::from(offset)),
        (Paging::Legacy, false) => None,
        // Where the next page starts; 0 on the last page.
        (Paging::Current, true) => Some(u64::from(offset) + returned as u64),
        (Paging::Current, false) => Some(0),
    };
    if let Some(next) = next_offset
        && let Ok(value) = HeaderValue::from_str(&next.to_string())
    {
        headers.insert("x-next-offset", value);
    }
    headers
}

/// A list's page size: default 20, 1 to 100.
pub fn list_limit(limit: Option<u32>) -> Result<u32, ApiError> {
    let limit = limit.unwrap_or(DEFAULT_LIST_LIMIT);
    if !(1..=MAX_LIST_LIMIT).contains(&limit) {
        return Err(ApiError::invalid_field(format!(
            "limit must be between 1 and {}",
            MAX_LIST_LIMIT
        )));
    }
    Ok(limit)
}

/// Declares a list's query parameters: the struct's own filters, then `limit` (1 to 100,
/// default 20) and `offset`. Unknown parameters are refused: a filter this server does not
/// apply must not look applied.
macro_rules! list_query {
    ($(#[$meta:meta])* pub struct $name:ident { $($(#[$field_meta:meta])* pub $field:ident: $type:ty,)* }) => {
        $(#[$meta])*
        #[derive(Debug, Default, serde::Deserialize, utoipa::IntoParams)]
        #[into_params(parameter_in = Query)]
        #[serde(deny_unknown_fields)]
        pub struct $name {
            $($(#[$field_meta])* pub $field: $type,)*
            /// 1 to 100, default 20.
            #[param(minimum = 1, maximum = 100)]
            pub limit: Option<u32>,
            #[param(value_type = Option<i64>, minimum = 0, maximum = 4294967295.0)]
            pub offset: Option<u32>,
        }
    };
}
pub(crate) use list_query;

/// One page (`limit` items from `offset`) of `items`, with its paging headers; `limit`
/// defaults to 20 and must be 1 to 100.
pub fn page_of<T>(
    paging: Paging, items: Vec<T>, limit: Option<u32>, offset: Option<u32>,
) -> Result<(HeaderMap, Vec<T>), ApiError> {
    let limit = list_limit(limit)?;
    let offset = offset.unwrap_or(0);
    let total = items.len();
    let page: Vec<T> = items.into_iter().skip(offset as usize).take(limit as usize).collect();
    let has_more = (offset as usize).saturating_add(page.len()) < total;
    Ok((page_headers(paging, offset, page.len(), has_more), page))
}

list_query! {
    /// `query`, `name`, `limit` and `offset` of the lists of named resources (profiles,
    /// extensions, proxies, pools). Unknown parameters are refused: a filter this server does
    /// not apply must not look applied.
    pub struct NamedListQuery {
        /// Only those whose name or id contains this text (case-insensitive).
        pub query: Option<String>,
        /// Only the one with this name (case-insensitive).
        pub name: Option<String>,
    }
}

impl NamedListQuery {
    /// The page of `items` (in their order) that pass the filters; `key` gives an item's
    /// id and name.
    pub fn page<T>(
        &self, paging: Paging, items: Vec<T>, key: impl Fn(&T) -> (&str, Option<&str>),
    ) -> Result<(HeaderMap, Vec<T>), ApiError> {
        page_of(paging, self.filter(items, key), self.limit, self.offset)
    }

    /// `page`, for lists the seed-era SDK reads as one plain array (extensions, proxies,
    /// pools): a seed-era client that asks for no page gets every item.
    pub fn page_or_all<T>(
        &self, paging: Paging, items: Vec<T>, key: impl Fn(&T) -> (&str, Option<&str>),
    ) -> Result<(HeaderMap, Vec<T>), ApiError> {
        if paging == Paging::Legacy && self.limit.is_none() && self.offset.is_none() {
            let items = self.filter(items, key);
            return Ok((page_headers(paging, 0, items.len(), false), items));
        }
        self.page(paging, items, key)
    }

    fn filter<T>(&self, mut items: Vec<T>, key: impl Fn(&T) -> (&str, Option<&str>)) -> Vec<T> {
        if let Some(text) = self.query.as_deref().filter(|text| !text.is_empty()) {
            let text = text.to_lowercase();
            items.retain(|item| {
                let (id, name) = key(item);
                id.to_lowercase().contains(&text)
                    || name.is_some_and(|name| name.to_lowercase().contains(&text))
            });
        }
        if let Some(wanted) = &self.name {
            let wanted = wanted.to_lowercase();
            items.retain(|item| key(item).1.is_some_and(|name| name.to_lowercase() == wanted));
        }
        items
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paging(pairs: &[(&'static str, &'static str)]) -> Paging {
        let mut headers = HeaderMap::new();
        for (name, value) in pairs {
            headers.insert(*name, value.parse().expect("header value"));
        }
        Paging::of(&headers)
    }

    #[test]
    fn each_sdk_generation_gets_its_convention() {
        let python = |version| {
            paging(&[("x-stainless-lang", "python"), ("x-stainless-package-version", version)])
        };
        assert_eq!(python("0.40.0"), Paging::Legacy);
        assert_eq!(python("0.67.3"), Paging::Legacy);
        assert_eq!(python("0.68.0"), Paging::Current);
        assert_eq!(python("0.131.0"), Paging::Current);
        assert_eq!(python("1.0.0"), Paging::Current);
        assert_eq!(python("garbage"), Paging::Current);
        assert_eq!(
            paging(&[("x-stainless-lang", "js"), ("x-stainless-package-version", "0.84.0")]),
            Paging::Current
        );
        assert_eq!(paging(&[]), Paging::Current);
    }
}

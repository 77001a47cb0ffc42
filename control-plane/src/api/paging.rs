//! Which paging convention a client reads. The two Kernel SDK generations read
//! `X-Next-Offset` differently: up to Python 0.67 the next request starts at
//! `X-Next-Offset` plus the items received; from Python 0.68 (and in the TypeScript SDK)
//! it is the next page's absolute start, with 0 on the last page. The SDKs say who they
//! are in `X-Stainless-Lang` and `X-Stainless-Package-Version`; clients that do not say
//! get today's convention.

use std::convert::Infallible;

use axum::extract::FromRequestParts;
use axum::http::HeaderMap;
use axum::http::request::Parts;

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
            let mut parts = version
                .trim()
                .split('.')
                .map(|part| part.parse::<u64>().ok());
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
            paging(&[
                ("x-stainless-lang", "python"),
                ("x-stainless-package-version", version),
            ])
        };
        assert_eq!(python("0.40.0"), Paging::Legacy);
        assert_eq!(python("0.67.3"), Paging::Legacy);
        assert_eq!(python("0.68.0"), Paging::Current);
        assert_eq!(python("0.131.0"), Paging::Current);
        assert_eq!(python("1.0.0"), Paging::Current);
        assert_eq!(python("garbage"), Paging::Current);
        assert_eq!(
            paging(&[
                ("x-stainless-lang", "js"),
                ("x-stainless-package-version", "0.84.0")
            ]),
            Paging::Current
        );
        assert_eq!(paging(&[]), Paging::Current);
    }
}

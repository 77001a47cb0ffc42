//! Writing objects into a customer's S3 bucket the way AWS expects a third party to:
//! this server's own AWS identity (the standard `AWS_ACCESS_KEY_ID`,
//! `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN` variables) assumes the customer's role
//! through STS with the destination's external id (the confused-deputy guard), and the
//! short-lived credentials it gets write the object. Every request is signed with
//! Signature Version 4 (`aws-sigv4`).

use std::time::{Duration, SystemTime};

use aws_credential_types::Credentials;
use aws_sigv4::http_request::{
    PercentEncodingMode, SignableBody, SignableRequest, SigningSettings, UriPathNormalizationMode,
    sign,
};
use aws_sigv4::sign::v4;
use sha2::Digest;

/// Where STS and S3 are, and who this server is to AWS.
#[derive(Clone, Default)]
pub struct AwsSettings {
    /// STS's URL; `None`: the destination region's (`https://sts.<region>.amazonaws.com`).
    pub sts_endpoint: Option<String>,
    /// An S3-compatible endpoint, addressed path-style (`<endpoint>/<bucket>/<key>`);
    /// `None`: AWS's, virtual-hosted (`https://<bucket>.s3.<region>.amazonaws.com`).
    pub s3_endpoint: Option<String>,
    /// This server's own credentials; `None`: none configured (delivery fails, saying so).
    pub credentials: Option<Credentials>,
    /// The ARN customers trust in their role's policy (`kernel_role_arn`).
    pub principal_arn: String,
}

impl AwsSettings {
    /// The settings of `--audit-export-*` with credentials from the environment.
    pub fn from_environment(
        sts_endpoint: Option<String>, s3_endpoint: Option<String>, principal_arn: String,
    ) -> Self {
        let variable = |name: &str| std::env::var(name).ok().filter(|value| !value.is_empty());
        let credentials = match (variable("AWS_ACCESS_KEY_ID"), variable("AWS_SECRET_ACCESS_KEY")) {
            (Some(key), Some(secret)) => Some(Credentials::new(
                key,
                secret,
                variable("AWS_SESSION_TOKEN"),
                None,
                "environment",
            )),
            _ => None,
        };
        Self { sts_endpoint, s3_endpoint, credentials, principal_arn }
    }
}

/// Which step failed, as the SDK's test result names it.
#[derive(Debug)]
pub enum DeliveryError {
    AssumeRole(String),
    PutObject(String),
}

impl DeliveryError {
    pub fn message(&self) -> &str {
        match self {
            Self::AssumeRole(message) | Self::PutObject(message) => message,
        }
    }
}

/// One request to an AWS service, before it is signed.
struct AwsRequest<'a> {
    service: &'a str,
    region: &'a str,
    method: &'a str,
    url: &'a str,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

pub struct S3Writer {
    settings: AwsSettings,
    http: reqwest::Client,
}

/// What one AWS answer said, shortened: never a credential (answers that carry them are
/// read, not quoted).
fn aws_error(status: reqwest::StatusCode, body: &str) -> String {
    let code = xml_text(body, "Code").unwrap_or_default();
    let message = xml_text(body, "Message").unwrap_or_default();
    let mut text = format!("{status} {code} {message}");
    text.truncate(300);
    text.trim().to_owned()
}

/// The text of the first `<tag>` in an AWS XML answer (their documented, flat shapes
/// need no more than this).
fn xml_text(xml: &str, tag: &str) -> Option<String> {
    let start = xml.find(&format!("<{tag}>"))? + tag.len() + 2;
    let end = start + xml[start..].find(&format!("</{tag}>"))?;
    Some(
        xml[start..end]
            .replace("&lt;", "<")
            .replace("&gt;", ">")
            .replace("&quot;", "\"")
            .replace("&apos;", "'")
            .replace("&amp;", "&"),
    )
}

impl S3Writer {
    pub fn new(settings: AwsSettings) -> Self {
        // Building fails only without a TLS backend, which this build has.
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap_or_default();
        Self { settings, http }
    }

    pub fn principal_arn(&self) -> &str {
        &self.settings.principal_arn
    }

    /// Sends the request signed; the answer's body if AWS did what it asked, else why
    /// not (`refused` says what was refused, AWS's error why).
    async fn call(
        &self, credentials: &Credentials, request: AwsRequest<'_>, refused: impl FnOnce() -> String,
    ) -> Result<String, String> {
        let (status, body) = self.send_signed(credentials, request).await?;
        if !status.is_success() {
            return Err(format!("{}: {}", refused(), aws_error(status, &body)));
        }
        Ok(body)
    }

    /// `request`, signed by `credentials` (its headers too), sent.
    async fn send_signed(
        &self, credentials: &Credentials, request: AwsRequest<'_>,
    ) -> Result<(reqwest::StatusCode, String), String> {
        let AwsRequest { service, region, method, url, headers, body } = request;
        let identity = credentials.clone().into();
        let mut settings = SigningSettings::default();
        if service == "s3" {
            // S3 signs the path as sent (encoded once by `put_object`), unnormalized.
            settings.percent_encoding_mode = PercentEncodingMode::Single;
            settings.uri_path_normalization_mode = UriPathNormalizationMode::Disabled;
        }
        let params = v4::SigningParams::builder()
            .identity(&identity)
            .region(region)
            .name(service)
            .time(SystemTime::now())
            .settings(settings)
            .build()
            .map_err(|error| format!("signing: {error}"))?
            .into();
        let signable = SignableRequest::new(
            method,
            url,
            headers.iter().map(|(name, value)| (name.as_str(), value.as_str())),
            SignableBody::Bytes(&body),
        )
        .map_err(|error| format!("signing: {error}"))?;
        let (instructions, _) =
            sign(signable, &params).map_err(|error| format!("signing: {error}"))?.into_parts();
        let method = reqwest::Method::from_bytes(method.as_bytes())
            .map_err(|error| format!("method: {error}"))?;
        let mut request = self.http.request(method, url).body(body);
        for (name, value) in headers.iter() {
            request = request.header(name, value);
        }
        for (name, value) in instructions.headers() {
            request = request.header(name, value);
        }
        let response =
            request.send().await.map_err(|error| format!("{url}: {}", without_url(&error)))?;
        let status = response.status();
        let text = response.text().await.unwrap_or_default();
        Ok((status, text))
    }

    /// Short-lived credentials of `role_arn`, assumed with `external_id`.
    pub async fn assume_role(
        &self, region: &str, role_arn: &str, external_id: &str,
    ) -> Result<Credentials, DeliveryError> {
        let fail = DeliveryError::AssumeRole;
        let own = self.settings.credentials.as_ref().ok_or_else(|| {
            fail("this server has no AWS credentials (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY) to assume the role with".into())
        })?;
        let url = self
            .settings
            .sts_endpoint
            .clone()
            .unwrap_or_else(|| format!("https://sts.{region}.amazonaws.com/"));
        let form = form_urlencoded::Serializer::new(String::new())
            .append_pair("Action", "AssumeRole")
            .append_pair("Version", "2011-06-15")
            .append_pair("RoleArn", role_arn)
            .append_pair("RoleSessionName", "audit-log-export")
            .append_pair("ExternalId", external_id)
            .append_pair("DurationSeconds", "900")
            .finish();
        let headers = vec![(
            "content-type".to_owned(),
            "application/x-www-form-urlencoded; charset=utf-8".to_owned(),
        )];
        let request = AwsRequest {
            service: "sts",
            region,
            method: "POST",
            url: &url,
            headers,
            body: form.into_bytes(),
        };
        let refused = || format!("STS refused to assume {role_arn}");
        let body = self.call(own, request, refused).await.map_err(fail)?;
        let field = |tag: &str| {
            xml_text(&body, tag).ok_or_else(|| fail(format!("STS answered without {tag}")))
        };
        Ok(Credentials::new(
            field("AccessKeyId")?,
            field("SecretAccessKey")?,
            Some(field("SessionToken")?),
            None,
            "assumed-role",
        ))
    }

    /// Writes `body` to `key` in `bucket` (SSE-KMS with `kms_key_id` when given).
    pub async fn put_object(
        &self, credentials: &Credentials, region: &str, bucket: &str, key: &str, body: Vec<u8>,
        kms_key_id: Option<&str>,
    ) -> Result<(), DeliveryError> {
        let fail = DeliveryError::PutObject;
        let path: String = key
            .split('/')
            .map(|segment| {
                percent_encoding::utf8_percent_encode(segment, percent_encoding::NON_ALPHANUMERIC)
                    .to_string()
                    .replace("%2D", "-")
                    .replace("%2E", ".")
                    .replace("%5F", "_")
                    .replace("%7E", "~")
            })
            .collect::<Vec<_>>()
            .join("/");
        let url = match &self.settings.s3_endpoint {
            Some(endpoint) => format!("{}/{bucket}/{path}", endpoint.trim_end_matches('/')),
            None => format!("https://{bucket}.s3.{region}.amazonaws.com/{path}"),
        };
        let mut headers = vec![
            ("x-amz-content-sha256".to_owned(), hex::encode(sha2::Sha256::digest(&body))),
            ("content-type".to_owned(), "application/x-ndjson".to_owned()),
            ("content-encoding".to_owned(), "gzip".to_owned()),
        ];
        if let Some(kms_key_id) = kms_key_id {
            headers.push(("x-amz-server-side-encryption".to_owned(), "aws:kms".to_owned()));
            headers.push((
                "x-amz-server-side-encryption-aws-kms-key-id".to_owned(),
                kms_key_id.to_owned(),
            ));
        }
        let request = AwsRequest { service: "s3", region, method: "PUT", url: &url, headers, body };
        let refused = || format!("S3 refused to write {key} to bucket {bucket}");
        self.call(credentials, request, refused).await.map_err(fail)?;
        Ok(())
    }
}

/// A transport error's text without the URL it repeats.
fn without_url(error: &reqwest::Error) -> String {
    let mut source: Option<&dyn std::error::Error> = Some(error);
    let mut text = String::new();
    while let Some(error) = source {
        text = error.to_string();
        source = error.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xml_text_reads_aws_answers() {
        let answer = "<AssumeRoleResponse><AssumeRoleResult><Credentials>\
            <AccessKeyId>ASIA1</AccessKeyId><SecretAccessKey>s&amp;k</SecretAccessKey>\
            </Credentials></AssumeRoleResult></AssumeRoleResponse>";
        assert_eq!(xml_text(answer, "AccessKeyId").as_deref(), Some("ASIA1"));
        assert_eq!(xml_text(answer, "SecretAccessKey").as_deref(), Some("s&k"));
        assert_eq!(xml_text(answer, "SessionToken"), None);
        let error = "<ErrorResponse><Error><Code>AccessDenied</Code><Message>no</Message></Error></ErrorResponse>";
        assert_eq!(
            aws_error(reqwest::StatusCode::FORBIDDEN, error),
            "403 Forbidden AccessDenied no"
        );
    }
}

//! One-time codes (TOTP, RFC 6238) of a credential, computed with `totp-rs`: the settings
//! (algorithm, digits, period) are public; the seed is sealed with the credential's values.

use chrono::{DateTime, TimeZone, Utc};
use serde::{Deserialize, Serialize};
use totp_rs::{Algorithm, Secret, TOTP};

/// The SDK's accepted seed lengths, in base32 characters.
const SEED_CHARS: std::ops::RangeInclusive<usize> = 16..=128;
const DIGITS: std::ops::RangeInclusive<u32> = 6..=8;
const PERIOD_SECONDS: std::ops::RangeInclusive<u32> = 10..=300;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TotpAlgorithm {
    SHA1,
    SHA256,
    SHA512,
}

impl TotpAlgorithm {
    pub fn parse(text: &str) -> Result<Self, String> {
        match text.to_ascii_uppercase().as_str() {
            "SHA1" => Ok(Self::SHA1),
            "SHA256" => Ok(Self::SHA256),
            "SHA512" => Ok(Self::SHA512),
            _ => Err(format!("totp_algorithm must be SHA1, SHA256 or SHA512, got {text:?}")),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::SHA1 => "SHA1",
            Self::SHA256 => "SHA256",
            Self::SHA512 => "SHA512",
        }
    }
}

/// How codes are made from the seed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TotpSettings {
    pub algorithm: TotpAlgorithm,
    pub digits: u32,
    pub period: u32,
}

impl Default for TotpSettings {
    fn default() -> Self {
        Self { algorithm: TotpAlgorithm::SHA1, digits: 6, period: 30 }
    }
}

/// Settings given next to a seed; `None` keeps the base's.
#[derive(Clone, Copy, Debug, Default)]
pub struct GivenSettings {
    pub algorithm: Option<TotpAlgorithm>,
    pub digits: Option<u32>,
    pub period: Option<u32>,
}

/// A seed (unpadded upper-case base32) and its settings, from what a request gave:
/// a base32 seed (spaces, dashes and padding ignored) with `given` over `base`, or an
/// `otpauth://totp/…` URI whose parameters, where present, win over `given` (absent ones
/// fall back to `given`, then to SHA1/6/30).
pub fn parse_seed(
    text: &str, given: GivenSettings, base: TotpSettings,
) -> Result<(String, TotpSettings), String> {
    let trimmed = text.trim();
    let is_uri = trimmed.get(..10).is_some_and(|scheme| scheme.eq_ignore_ascii_case("otpauth://"));
    let (seed, settings) = if is_uri {
        let (seed, from_uri) = parse_uri(trimmed)?;
        let defaults = TotpSettings::default();
        let settings = TotpSettings {
            algorithm: from_uri.algorithm.or(given.algorithm).unwrap_or(defaults.algorithm),
            digits: from_uri.digits.or(given.digits).unwrap_or(defaults.digits),
            period: from_uri.period.or(given.period).unwrap_or(defaults.period),
        };
        (seed, settings)
    } else {
        let settings = TotpSettings {
            algorithm: given.algorithm.unwrap_or(base.algorithm),
            digits: given.digits.unwrap_or(base.digits),
            period: given.period.unwrap_or(base.period),
        };
        (trimmed.to_owned(), settings)
    };
    let seed = normalized_seed(&seed)?;
    check_settings(&settings)?;
    Ok((seed, settings))
}

/// Explicit settings must be in range even where a URI's own parameters win.
pub fn check_given(given: &GivenSettings) -> Result<(), String> {
    let defaults = TotpSettings::default();
    check_settings(&TotpSettings {
        algorithm: defaults.algorithm,
        digits: given.digits.unwrap_or(defaults.digits),
        period: given.period.unwrap_or(defaults.period),
    })
}

impl GivenSettings {
    pub fn any(&self) -> bool {
        self.algorithm.is_some() || self.digits.is_some() || self.period.is_some()
    }
}

fn check_settings(settings: &TotpSettings) -> Result<(), String> {
    within("totp_digits", &DIGITS, settings.digits, "")?;
    within("totp_period", &PERIOD_SECONDS, settings.period, " seconds")
}

fn within(
    name: &str, range: &std::ops::RangeInclusive<u32>, value: u32, unit: &str,
) -> Result<(), String> {
    if range.contains(&value) {
        return Ok(());
    }
    Err(format!("{name} must be {} to {}{unit}, got {value}", range.start(), range.end()))
}

fn normalized_seed(text: &str) -> Result<String, String> {
    let seed: String = text
        .chars()
        .filter(|c| !matches!(c, ' ' | '-' | '='))
        .map(|c| c.to_ascii_uppercase())
        .collect();
    if !SEED_CHARS.contains(&seed.len()) {
        return Err(format!(
            "totp_secret must be {} to {} base32 characters (or an otpauth://totp/ URI), got {}",
            SEED_CHARS.start(),
            SEED_CHARS.end(),
            seed.len()
        ));
    }
    if Secret::Encoded(seed.clone()).to_bytes().is_err() {
        return Err("totp_secret is not base32 (letters A-Z and digits 2-7)".into());
    }
    Ok(seed)
}

/// The seed and the settings present in an `otpauth://totp/label?secret=…` URI.
fn parse_uri(text: &str) -> Result<(String, GivenSettings), String> {
    let bad = |why: &str| format!("totp_secret is not a valid otpauth://totp/ URI: {why}");
    let uri = url::Url::parse(text).map_err(|error| bad(&error.to_string()))?;
    if uri.host_str().map(str::to_ascii_lowercase).as_deref() != Some("totp") {
        return Err(bad("only totp is supported"));
    }
    let mut seed = None;
    let mut settings = GivenSettings::default();
    for (key, value) in uri.query_pairs() {
        match key.to_ascii_lowercase().as_str() {
            "secret" => seed = Some(value.into_owned()),
            "algorithm" => settings.algorithm = Some(TotpAlgorithm::parse(&value)?),
            "digits" => {
                settings.digits = Some(value.parse().map_err(|_| bad("digits is not a number"))?)
            }
            "period" => {
                settings.period = Some(value.parse().map_err(|_| bad("period is not a number"))?)
            }
            _ => {}
        }
    }
    Ok((seed.ok_or_else(|| bad("no secret"))?, settings))
}

/// The code for `at`, and when it stops being current.
pub fn code_at(
    seed: &str, settings: &TotpSettings, at: DateTime<Utc>,
) -> Result<(String, DateTime<Utc>), String> {
    let bytes = Secret::Encoded(seed.to_owned())
        .to_bytes()
        .map_err(|_| "the stored TOTP seed is not base32".to_owned())?;
    let algorithm = match settings.algorithm {
        TotpAlgorithm::SHA1 => Algorithm::SHA1,
        TotpAlgorithm::SHA256 => Algorithm::SHA256,
        TotpAlgorithm::SHA512 => Algorithm::SHA512,
    };
    // Unchecked: the SDK accepts seeds shorter than RFC 4226's 128 bits.
    let totp = TOTP::new_unchecked(
        algorithm,
        settings.digits as usize,
        0,
        u64::from(settings.period),
        bytes,
    );
    let seconds = u64::try_from(at.timestamp()).unwrap_or(0);
    let period = u64::from(settings.period);
    let ends = (seconds / period + 1) * period;
    let expires_at =
        Utc.timestamp_opt(i64::try_from(ends).unwrap_or(i64::MAX), 0).single().unwrap_or(at);
    Ok((totp.generate(seconds), expires_at))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 6238 appendix B: the seeds are the ASCII digits "1234567890" repeated to the
    /// hash's size, 8 digits, 30 s.
    #[test]
    fn codes_match_the_rfc_test_vectors() {
        let seed = |length: usize| {
            let ascii: Vec<u8> = b"1234567890".iter().copied().cycle().take(length).collect();
            match Secret::Raw(ascii).to_encoded() {
                Secret::Encoded(encoded) => encoded,
                Secret::Raw(_) => unreachable!("to_encoded encodes"),
            }
        };
        let at = Utc.timestamp_opt(1_111_111_109, 0).single().expect("time");
        for (algorithm, length, expected) in [
            (TotpAlgorithm::SHA1, 20, "07081804"),
            (TotpAlgorithm::SHA256, 32, "68084774"),
            (TotpAlgorithm::SHA512, 64, "25091201"),
        ] {
            let settings = TotpSettings { algorithm, digits: 8, period: 30 };
            let (code, expires_at) = code_at(&seed(length), &settings, at).expect("code");
            assert_eq!(code, expected, "{algorithm:?}");
            assert_eq!(expires_at.timestamp(), 1_111_111_110);
        }
    }

    #[test]
    fn uri_parameters_win_over_given_settings() {
        let given =
            GivenSettings { algorithm: Some(TotpAlgorithm::SHA512), digits: Some(8), period: None };
        let (seed, settings) = parse_seed(
            "otpauth://totp/Site:me?secret=jbsw y3dp ehpk 3pxp&digits=6&period=60&issuer=Site",
            given,
            TotpSettings::default(),
        )
        .expect("valid");
        assert_eq!(seed, "JBSWY3DPEHPK3PXP");
        assert_eq!(
            settings,
            TotpSettings { algorithm: TotpAlgorithm::SHA512, digits: 6, period: 60 }
        );
        // A raw seed keeps the base's settings where none are given.
        let base = TotpSettings { algorithm: TotpAlgorithm::SHA256, digits: 8, period: 60 };
        let (_, kept) = parse_seed("JBSWY3DPEHPK3PXP", GivenSettings::default(), base).expect("ok");
        assert_eq!(kept, base);
    }

    #[test]
    fn bad_seeds_and_settings_are_refused() {
        let refused = |text: &str, given: GivenSettings| {
            parse_seed(text, given, TotpSettings::default()).is_err()
        };
        assert!(refused("JBSWY3DP", GivenSettings::default()));
        assert!(refused("JBSWY3DPEHPK3PX1", GivenSettings::default()));
        assert!(refused("otpauth://hotp/x?secret=JBSWY3DPEHPK3PXP", GivenSettings::default()));
        assert!(refused("otpauth://totp/x?digits=6", GivenSettings::default()));
        assert!(refused(
            "otpauth://totp/x?secret=JBSWY3DPEHPK3PXP&algorithm=MD5",
            GivenSettings::default()
        ));
        let nine_digits = GivenSettings { digits: Some(9), ..GivenSettings::default() };
        assert!(refused("JBSWY3DPEHPK3PXP", nine_digits));
        assert!(TotpAlgorithm::parse("sha256").is_ok() && TotpAlgorithm::parse("SHA3").is_err());
        // Multi-byte characters where a scheme would end are just a bad seed.
        assert!(refused("otpauth:/é/totp?secret=JBSWY3DPEHPK3PXP", GivenSettings::default()));
    }
}

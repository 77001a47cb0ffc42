//! The OTLP values both the log records (`export`) and the spans (`spans`) are made of.

use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value};

pub(super) fn text(value: &str) -> Option<AnyValue> {
    Some(AnyValue { value: Some(any_value::Value::StringValue(value.to_owned())) })
}

pub(super) fn int(value: i64) -> Option<AnyValue> {
    Some(AnyValue { value: Some(any_value::Value::IntValue(value)) })
}

pub(super) fn attribute(key: &str, value: Option<AnyValue>) -> KeyValue {
    KeyValue { key: key.to_owned(), value, ..KeyValue::default() }
}

/// Who made the records and spans: this service's telemetry, at this version.
pub(super) fn scope() -> InstrumentationScope {
    InstrumentationScope {
        name: "kernel.browser.telemetry".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        ..InstrumentationScope::default()
    }
}

//! Adyen's published OpenAPI 3.1 documents (`tests/fixtures/adyen/`) as JSON Schema 2020-12
//! validators: a component is validated with the whole document as the root schema and
//! `"$ref": "#/components/schemas/<Name>"` at the top, so that every reference inside it
//! resolves in the same document. Formats (`date-time`) are asserted, not only annotated.
//! Every Adyen schema is `additionalProperties: false`, so a misspelled field fails.
#![allow(clippy::unwrap_used, dead_code)]

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use serde_json::Value;

/// One vendored OpenAPI document and the validators built from it, one per component.
pub struct Spec {
    name: &'static str,
    document: Value,
    validators: Mutex<HashMap<String, &'static jsonschema::Validator>>,
}

fn load(name: &'static str) -> Spec {
    let path = format!("{}/tests/fixtures/adyen/{name}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {path}: {e}"));
    Spec {
        name,
        document: serde_json::from_str(&text).unwrap(),
        validators: Mutex::new(HashMap::new()),
    }
}

/// Checkout API v71 (`PaymentResponse`, `PaymentCaptureResponse`, `ServiceError`, …).
pub fn checkout() -> &'static Spec {
    static SPEC: OnceLock<Spec> = OnceLock::new();
    SPEC.get_or_init(|| load("CheckoutService-v71.json"))
}

/// Webhooks v1 (`NotificationRequest`, the items of each event code).
pub fn webhooks() -> &'static Spec {
    static SPEC: OnceLock<Spec> = OnceLock::new();
    SPEC.get_or_init(|| load("Webhooks-v1.json"))
}

impl Spec {
    pub fn document(&self) -> &Value {
        &self.document
    }

    /// The validator of `#/components/schemas/<component>`, built once.
    pub fn validator(&self, component: &str) -> &'static jsonschema::Validator {
        let mut validators = self.validators.lock().unwrap();
        if let Some(validator) = validators.get(component) {
            return validator;
        }
        assert!(
            self.document["components"]["schemas"]
                .get(component)
                .is_some(),
            "{} has no component {component}",
            self.name
        );
        let mut root = self.document.clone();
        root["$ref"] = Value::from(format!("#/components/schemas/{component}"));
        let validator = jsonschema::options()
            .with_draft(jsonschema::Draft::Draft202012)
            .should_validate_formats(true)
            .build(&root)
            .unwrap_or_else(|e| panic!("{component} of {} does not compile: {e}", self.name));
        let validator: &'static jsonschema::Validator = Box::leak(Box::new(validator));
        validators.insert(component.to_owned(), validator);
        validator
    }

    /// Why `instance` is not a `component`, one line per error; empty when it is.
    pub fn errors(&self, component: &str, instance: &Value) -> Vec<String> {
        self.validator(component)
            .iter_errors(instance)
            .map(|error| format!("at {}: {error}", error.instance_path()))
            .collect()
    }

    /// Panics with every error when `instance` is not a `component`.
    pub fn assert_valid(&self, component: &str, instance: &Value) {
        let errors = self.errors(component, instance);
        assert!(
            errors.is_empty(),
            "not a valid {component} ({}):\n{}\n{instance:#}",
            self.name,
            errors.join("\n")
        );
    }

    /// The request schema of a webhook event code (`webhooks["/CAPTURE"]`'s body).
    pub fn webhook_request(&self, event_code: &str) -> String {
        let reference = &self.document["webhooks"][format!("/{event_code}")]["post"]["requestBody"]
            ["content"]["application/json"]["schema"]["$ref"];
        component_name(reference)
            .unwrap_or_else(|| panic!("{} has no webhook {event_code}", self.name))
    }

    /// The item schema of a webhook event code: its request's `notificationItems` wrapper's
    /// `NotificationRequestItem`.
    pub fn webhook_item(&self, event_code: &str) -> String {
        let schemas = &self.document["components"]["schemas"];
        let request = self.webhook_request(event_code);
        let wrapper =
            component_name(&schemas[&request]["properties"]["notificationItems"]["items"]["$ref"])
                .unwrap();
        component_name(&schemas[&wrapper]["properties"]["NotificationRequestItem"]["$ref"]).unwrap()
    }
}

fn component_name(reference: &Value) -> Option<String> {
    reference
        .as_str()?
        .strip_prefix("#/components/schemas/")
        .map(str::to_owned)
}

//! `kvgate import-sagemaker FILE.json`: a SageMaker endpoint config (as
//! `aws sagemaker describe-endpoint-config` prints it) turned into kvgate's
//! `endpoints:` section, one endpoint per production variant, with its
//! `RoutingConfig` (`RoutingStrategy`, `PrefixLength`, `ConcurrencyThreshold`)
//! as the endpoint's `routing`. SageMaker does not say where the instances
//! are: they are the `--instance` URLs given, or placeholders to replace,
//! `InitialInstanceCount` of them. The output is checked by the same
//! validation as `kvgate check` before it is printed.

use std::fmt::Write as _;

use serde::Deserialize;

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct EndpointConfig {
    endpoint_config_name: Option<String>,
    production_variants: Vec<Variant>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Variant {
    variant_name: String,
    model_name: Option<String>,
    initial_instance_count: Option<u32>,
    routing_config: Option<RoutingConfig>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct RoutingConfig {
    routing_strategy: Option<String>,
    prefix_length: Option<u64>,
    concurrency_threshold: Option<u64>,
}

/// kvgate's endpoint names: letters, digits, `.`, `_`, `-`.
fn endpoint_name(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '-'
            }
        })
        .collect()
}

/// A YAML double-quoted scalar.
fn quoted(s: &str) -> String {
    serde_json::Value::String(s.to_owned()).to_string()
}

/// The `endpoints:` YAML for `json`, with `instances` as every variant's
/// instance URLs when given.
pub fn import(json: &str, instances: &[String]) -> Result<String, String> {
    let config: EndpointConfig =
        serde_json::from_str(json).map_err(|e| format!("not a SageMaker endpoint config: {e}"))?;
    if config.production_variants.is_empty() {
        return Err("ProductionVariants is empty".into());
    }
    let single = config.production_variants.len() == 1;
    let mut out = String::from("endpoints:\n");
    for v in &config.production_variants {
        // One variant: the endpoint keeps the config's name, as boto3 calls it.
        let name = match (&config.endpoint_config_name, single) {
            (Some(n), true) => endpoint_name(n),
            _ => endpoint_name(&v.variant_name),
        };
        let model = v.model_name.as_deref().unwrap_or(&v.variant_name);
        let _ = writeln!(out, "  - name: {}", quoted(&name));
        let _ = writeln!(out, "    models: [{}]", quoted(model));
        let _ = writeln!(out, "    instances:");
        if instances.is_empty() {
            let n = v.initial_instance_count.unwrap_or(1).max(1);
            let _ = writeln!(
                out,
                "      # SageMaker does not say where they run: replace these {n} placeholders"
            );
            for i in 0..n {
                let _ = writeln!(
                    out,
                    "      - url: {}",
                    quoted(&format!("http://{}-{i}:8080", name.to_ascii_lowercase()))
                );
            }
        } else {
            for url in instances {
                let _ = writeln!(out, "      - url: {}", quoted(url));
            }
        }
        let r = v.routing_config.as_ref();
        let _ = writeln!(out, "    routing:");
        let strategy = r
            .and_then(|r| r.routing_strategy.as_deref())
            .unwrap_or("LEAST_OUTSTANDING_REQUESTS");
        let _ = writeln!(out, "      strategy: {}", quoted(strategy));
        if let Some(n) = r.and_then(|r| r.prefix_length) {
            let _ = writeln!(out, "      prefix_length: {n}");
        }
        if let Some(n) = r.and_then(|r| r.concurrency_threshold) {
            let _ = writeln!(out, "      concurrency_threshold: {n}");
        }
    }
    crate::Config::from_yaml(&out).map_err(|e| format!("the imported config is not valid: {e}"))?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PREFIX_AWARE: &str = r#"{
      "EndpointConfigName": "llama 3 endpoint",
      "ProductionVariants": [{
        "VariantName": "AllTraffic", "ModelName": "llama-3-8b", "InitialInstanceCount": 3,
        "InstanceType": "ml.g5.2xlarge",
        "RoutingConfig": {"RoutingStrategy": "PREFIX_AWARE", "PrefixLength": 2048, "ConcurrencyThreshold": 16}
      }]
    }"#;

    #[test]
    fn a_prefix_aware_variant_becomes_a_prefix_aware_endpoint() {
        let yaml = import(PREFIX_AWARE, &[]).unwrap();
        let c = crate::Config::from_yaml(&yaml).unwrap();
        let ep = &c.endpoints[0];
        assert_eq!(ep.name, "llama-3-endpoint");
        assert_eq!(ep.models, ["llama-3-8b"]);
        assert_eq!(ep.instances.len(), 3);
        assert_eq!(ep.routing.strategy, kvgate_routing::Strategy::PrefixAware);
        assert_eq!(ep.routing.prefix_length, 2048);
        assert_eq!(ep.routing.concurrency_threshold, 16);
        let urls = ["http://10.0.0.1:8000".to_owned()];
        let yaml = import(PREFIX_AWARE, &urls).unwrap();
        assert!(yaml.contains("http://10.0.0.1:8000"), "{yaml}");
    }

    #[test]
    fn variants_become_endpoints_and_bad_input_is_named() {
        let two = r#"{"ProductionVariants": [
            {"VariantName": "a", "ModelName": "m1"},
            {"VariantName": "b", "ModelName": "m2", "RoutingConfig": {"RoutingStrategy": "RANDOM"}}]}"#;
        let c = crate::Config::from_yaml(&import(two, &[]).unwrap()).unwrap();
        assert_eq!(c.endpoints.len(), 2);
        assert_eq!(
            c.endpoints[1].routing.strategy,
            kvgate_routing::Strategy::Random
        );
        assert!(
            import("{}", &[])
                .unwrap_err()
                .contains("ProductionVariants")
        );
        let bad = PREFIX_AWARE.replace("2048", "1");
        assert!(import(&bad, &[]).unwrap_err().contains("prefix_length"));
    }
}

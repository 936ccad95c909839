//! List requests: one-clause filters, pages, and aggregated lists.

use std::collections::BTreeMap;

use google_cloud_compute_v1::model;
use serde_json::{Value, json};

use super::{ApiError, Collection, State};

/// A page of `(scope, resource)` and the next page's token.
type Page = (Vec<(String, Value)>, Option<String>);

/// A one-clause list filter.
struct Filter {
    field: String,
    matches: Box<dyn Fn(&str) -> bool + Send>,
}

impl std::fmt::Debug for Filter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Filter")
            .field("field", &self.field)
            .finish_non_exhaustive()
    }
}

/// Parses `name eq "RE2"`, `name ne RE2`, `name = "x"`, `name != x` (Compute's own list-filter forms for
/// one field).
fn parse_filter(filter: &str) -> Result<Filter, ApiError> {
    let invalid = || {
        ApiError::new(
            400,
            "invalid",
            format!("Invalid value for field 'filter': '{filter}'."),
        )
    };
    let mut parts = filter.trim().splitn(3, char::is_whitespace);
    let (Some(field), Some(op), Some(literal)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(invalid());
    };
    let literal = literal.trim();
    let literal = literal
        .strip_prefix('"')
        .and_then(|l| l.strip_suffix('"'))
        .or_else(|| literal.strip_prefix('\'').and_then(|l| l.strip_suffix('\'')))
        .unwrap_or(literal)
        .to_owned();
    let matches: Box<dyn Fn(&str) -> bool + Send> = match op {
        "eq" | "ne" => {
            let re = regex::Regex::new(&format!("^(?:{literal})$")).map_err(|_| invalid())?;
            let negate = op == "ne";
            Box::new(move |v| re.is_match(v) != negate)
        }
        "=" => Box::new(move |v| v == literal),
        "!=" => Box::new(move |v| v != literal),
        _ => return Err(invalid()),
    };
    if !field.chars().all(|c| c.is_ascii_alphanumeric()) {
        return Err(invalid());
    }
    Ok(Filter {
        field: field.to_owned(),
        matches,
    })
}

/// What a list request asks for.
#[derive(Debug, Default)]
pub(crate) struct ListQuery {
    pub(crate) filter: Option<String>,
    pub(crate) max_results: Option<String>,
    pub(crate) page_token: Option<String>,
}

impl ListQuery {
    fn page(&self) -> Result<(usize, usize), ApiError> {
        let max = match &self.max_results {
            None => 500,
            Some(m) => m
                .parse::<usize>()
                .ok()
                .filter(|m| (1..=500).contains(m))
                .ok_or_else(|| {
                    ApiError::new(
                        400,
                        "invalid",
                        format!("Invalid value for field 'maxResults': '{m}'. Must be between 0 and 500."),
                    )
                })?,
        };
        let start = match &self.page_token {
            None => 0,
            Some(t) if t.is_empty() => 0,
            Some(t) => t
                .strip_prefix("page-")
                .and_then(|n| n.parse().ok())
                .ok_or_else(|| {
                    ApiError::new(
                        400,
                        "invalid",
                        format!("Invalid value for field 'pageToken': '{t}'."),
                    )
                })?,
        };
        Ok((start, max))
    }
}

impl State {
    /// One page of `collection` in `scopes`, filtered.
    fn page(
        &self,
        collection: Collection,
        project: &str,
        scope: Option<&str>,
        query: &ListQuery,
    ) -> Result<Page, ApiError> {
        let filter = query
            .filter
            .as_deref()
            .filter(|f| !f.trim().is_empty())
            .map(parse_filter)
            .transpose()?;
        let (start, max) = query.page()?;
        let matching: Vec<(String, Value)> = self
            .resources
            .iter()
            .filter(|((c, p, s, _), _)| {
                *c == collection && p == project && scope.is_none_or(|scope| scope == s)
            })
            .filter(|(_, v)| {
                filter
                    .as_ref()
                    .is_none_or(|f| (f.matches)(v[&f.field].as_str().unwrap_or_default()))
            })
            .map(|((_, _, s, _), v)| (s.clone(), v.clone()))
            .collect();
        let next = (start + max < matching.len()).then(|| format!("page-{}", start + max));
        Ok((matching.into_iter().skip(start).take(max).collect(), next))
    }

    pub(crate) fn list(
        &self,
        collection: Collection,
        project: &str,
        scope: &str,
        query: &ListQuery,
    ) -> Result<Value, ApiError> {
        let (items, next) = self.page(collection, project, Some(scope), query)?;
        let link = format!(
            "{}/compute/v1/projects/{project}/{scope}/{}",
            self.base,
            collection.path()
        );
        let items = items
            .into_iter()
            .map(|(_, v)| self.presented(collection, v))
            .collect();
        Ok(collection.list(items, next, link))
    }

    /// `aggregated/<collection>`: every zone's or region's resources, keyed `zones/Z` or `regions/R`.
    pub(crate) fn aggregated(
        &self,
        collection: Collection,
        project: &str,
        query: &ListQuery,
    ) -> Result<Value, ApiError> {
        fn through<T: serde::de::DeserializeOwned + serde::Serialize>(value: Value) -> Value {
            let typed: T = serde_json::from_value(value).expect("an aggregated list is model-shaped");
            serde_json::to_value(typed).expect("it serialises")
        }
        let (items, next) = self.page(collection, project, None, query)?;
        let mut scoped: BTreeMap<String, Vec<Value>> = BTreeMap::new();
        for (scope, value) in items {
            if self.unreachable(project, &scope) {
                continue;
            }
            scoped
                .entry(scope)
                .or_default()
                .push(self.presented(collection, value));
        }
        let mut items: serde_json::Map<String, Value> = scoped
            .into_iter()
            .map(|(scope, resources)| (scope, json!({ collection.path(): resources })))
            .collect();
        // An unreachable zone is a scope with a warning and nothing listed (on every page).
        for (_, zone) in self.unreachable_zones.iter().filter(|(p, _)| p == project) {
            let scope = format!("zones/{zone}");
            items.insert(
                scope.clone(),
                json!({"warning": {
                    "code": "UNREACHABLE",
                    "message": format!("Scope '{scope}' is unreachable."),
                    "data": [{"key": "scope", "value": scope}],
                }}),
            );
        }
        let link = format!(
            "{}/compute/v1/projects/{project}/aggregated/{}",
            self.base,
            collection.path()
        );
        let value = json!({"kind": format!("{}AggregatedList", collection.kind()), "id": link, "selfLink": link, "items": items, "nextPageToken": next});
        Ok(match collection {
            Collection::Instances => through::<model::InstanceAggregatedList>(value),
            Collection::TargetPools => through::<model::TargetPoolAggregatedList>(value),
            Collection::ForwardingRules => through::<model::ForwardingRuleAggregatedList>(value),
            Collection::Addresses => through::<model::AddressAggregatedList>(value),
            Collection::InstanceGroups => through::<model::InstanceGroupAggregatedList>(value),
            _ => {
                return Err(ApiError::new(
                    404,
                    "notFound",
                    format!("aggregated/{} is not a collection", collection.path()),
                ));
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_of_one_clause() {
        let f = parse_filter("name eq \"(a-1|b-2)\"").unwrap();
        assert!((f.matches)("a-1") && (f.matches)("b-2") && !(f.matches)("a-10"));
        let f = parse_filter("name ne k8s-.*").unwrap();
        assert!(!(f.matches)("k8s-x") && (f.matches)("other"));
        let f = parse_filter("description = 'k8s-node-route'").unwrap();
        assert_eq!(f.field, "description");
        assert!((f.matches)("k8s-node-route") && !(f.matches)("k8s"));
        for bad in ["name", "name eq", "name ~ x", "name eq \"(\"", "a.b = x"] {
            let error = parse_filter(bad).unwrap_err();
            assert_eq!(error.status, 400, "{bad}");
        }
    }
}

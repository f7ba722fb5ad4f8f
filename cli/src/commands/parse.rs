//! Reading what a person typed: an activity's key, a status, `--input`.

use spool_proto::v1::{self, ActivityStatus};

use super::Error;

/// Reads `--input`: inline JSON, or `@path` for a file's contents.
pub(crate) fn input(value: &str) -> Result<v1::Payload, Error> {
    let data = match value.strip_prefix('@') {
        Some(path) => std::fs::read(path)
            .map_err(|e| Error::Usage(format!("cannot read --input file {path:?}: {e}")))?,
        None => value.as_bytes().to_vec(),
    };
    serde_json::from_slice::<serde_json::Value>(&data)
        .map_err(|e| Error::Usage(format!("--input is not valid JSON: {e}")))?;
    Ok(v1::Payload {
        content_type: "application/json".to_owned(),
        data,
    })
}

/// An activity's key from the command line: `key` is NAMESPACE/WORKFLOW_ID/ACTIVITY_ID
/// (as [`super::print::key_text`] prints it) or WORKFLOW_ID/ACTIVITY_ID, or, with `activity_id`,
/// the workflow id alone. The namespace part, when there is none, is `namespace`.
pub(crate) fn parse_key(
    key: &str,
    activity_id: Option<&str>,
    namespace: Option<&str>,
) -> Result<v1::ActivityKey, Error> {
    let (ns, workflow_id, activity_id) = match activity_id {
        Some(activity_id) => (None, key, activity_id),
        None => match key.split('/').collect::<Vec<_>>().as_slice() {
            [workflow_id, activity_id] => (None, *workflow_id, *activity_id),
            [ns, ..] if key.matches('/').count() >= 2 => {
                // Namespaces hold no '/': the first part is one; the last part is
                // the activity id, everything between the workflow id.
                let rest = &key[ns.len() + 1..];
                let (workflow_id, activity_id) = rest.rsplit_once('/').unwrap_or((rest, ""));
                (Some(*ns), workflow_id, activity_id)
            }
            _ => {
                return Err(Error::Usage(format!(
                    "{key:?} is not an activity key: give NAMESPACE/WORKFLOW_ID/ACTIVITY_ID (as \
                     spool prints it), WORKFLOW_ID/ACTIVITY_ID, or WORKFLOW_ID ACTIVITY_ID"
                )));
            }
        },
    };
    let namespace = match (ns, namespace) {
        (Some(a), Some(b)) if a != b => {
            return Err(Error::Usage(format!(
                "the key names namespace {a:?} but --namespace says {b:?}"
            )));
        }
        (Some(ns), _) | (None, Some(ns)) => ns,
        (None, None) => "",
    };
    if workflow_id.is_empty() || activity_id.is_empty() {
        return Err(Error::Usage(format!(
            "{key:?} leaves the workflow id or the activity id empty"
        )));
    }
    Ok(v1::ActivityKey {
        namespace: namespace.to_owned(),
        workflow_id: workflow_id.to_owned(),
        activity_id: activity_id.to_owned(),
    })
}

pub(crate) fn parse_status(s: &str) -> Result<ActivityStatus, String> {
    ActivityStatus::from_str_name(&format!("ACTIVITY_STATUS_{}", s.to_ascii_uppercase()))
        .filter(|s| *s != ActivityStatus::Unspecified)
        .ok_or_else(|| {
            format!("unknown status {s:?}: use scheduled, running, completed, failed or cancelled")
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commands::print::key_text;

    #[test]
    fn statuses_parse_case_insensitively() {
        assert_eq!(parse_status("failed"), Ok(ActivityStatus::Failed));
        assert_eq!(parse_status("FAILED"), Ok(ActivityStatus::Failed));
        assert_eq!(parse_status("Running"), Ok(ActivityStatus::Running));
        assert!(parse_status("unspecified").is_err());
        assert!(parse_status("done").is_err());
    }

    #[test]
    fn keys_read_back_as_printed() {
        let key = |ns: &str, wf: &str, act: &str| v1::ActivityKey {
            namespace: ns.into(),
            workflow_id: wf.into(),
            activity_id: act.into(),
        };
        let printed = key_text(Some(&key("default", "wf1", "a1")));
        assert_eq!(printed, "default/wf1/a1");
        assert_eq!(
            parse_key(&printed, None, None).ok(),
            Some(key("default", "wf1", "a1"))
        );
        assert_eq!(
            parse_key("wf1/a1", None, Some("ns")).ok(),
            Some(key("ns", "wf1", "a1"))
        );
        assert_eq!(
            parse_key("wf/with/slash", Some("a1"), None).ok(),
            Some(key("", "wf/with/slash", "a1"))
        );
        assert_eq!(
            parse_key("ns/wf/with/slash/a1", None, None).ok(),
            Some(key("ns", "wf/with/slash", "a1"))
        );
        assert!(parse_key("default/wf1/a1", None, Some("other")).is_err());
        assert!(parse_key("wf1", None, None).is_err());
        assert!(parse_key("ns//a1", None, None).is_err());
    }
}

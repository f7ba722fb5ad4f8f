//! The activity commands: submit, get, wait, cancel, retry (one key or `--all`)
//! and ls.

use std::time::Duration;

use spool_proto::v1::{self, ActivityStatus};

use super::{
    Bulk, Commands, Error, exit,
    print::{
        activity_json, activity_text, attempt_json, format_time, history_text, key_text,
        print_json, short_error, status_label, table,
    },
};

impl Commands {
    pub async fn submit(
        &self,
        request: v1::SubmitRequest,
        wait: Option<Option<Duration>>,
    ) -> Result<i32, Error> {
        let response = self.client.submit(request).await?;
        let activity = response.activity.unwrap_or_default();
        let Some(timeout) = wait else {
            if self.json {
                let mut json = activity_json(&activity);
                json["created"] = response.created.into();
                print_json(&json);
            } else {
                let verb = if response.created {
                    "submitted"
                } else {
                    "exists"
                };
                println!("{verb} {}", key_text(activity.key.as_ref()));
            }
            return Ok(exit::OK);
        };
        let done = self
            .client
            .wait(activity.key.unwrap_or_default(), timeout)
            .await?;
        if self.json {
            let mut json = activity_json(&done);
            json["created"] = response.created.into();
            print_json(&json);
        } else {
            print!("{}", activity_text(&done));
        }
        Ok(exit_for(&done))
    }

    pub async fn get(&self, key: v1::ActivityKey, history: bool) -> Result<i32, Error> {
        if !history {
            let activity = self.client.get(key).await?;
            self.print_activity(&activity);
            return Ok(exit::OK);
        }
        let activity = self.client.get_with_history(key).await?;
        if self.json {
            let mut value = activity_json(&activity);
            value["history"] = activity.history.iter().map(attempt_json).collect();
            print_json(&value);
        } else {
            print!("{}", activity_text(&activity));
            println!();
            print!("{}", history_text(&activity.history));
        }
        Ok(exit::OK)
    }

    /// Re-drives or cancels every activity `request` lists; with `dry_run`, only
    /// says which. The keys are read first, then acted on one by one: an activity
    /// that changed in between is reported, not forced.
    pub async fn bulk(
        &self,
        request: v1::ListRequest,
        action: Bulk,
        dry_run: bool,
    ) -> Result<i32, Error> {
        use tokio_stream::StreamExt as _;
        let mut keys = Vec::new();
        let mut listed = std::pin::pin!(self.client.list_stream(request));
        while let Some(activity) = listed.next().await {
            if let Some(key) = activity?.key {
                keys.push(key);
            }
        }
        let verb = match &action {
            Bulk::Retry => "re-drive",
            Bulk::Cancel { .. } => "cancel",
        };
        if dry_run {
            for key in &keys {
                println!("{}", key_text(Some(key)));
            }
            eprintln!("would {verb} {} activities (--dry-run)", keys.len());
            return Ok(exit::OK);
        }
        let mut failures = Vec::new();
        for key in &keys {
            let done = match &action {
                Bulk::Retry => self.client.retry(key.clone()).await,
                Bulk::Cancel { reason } => self.client.cancel(key.clone(), reason.clone()).await,
            };
            if let Err(e) = done {
                failures.push((key_text(Some(key)), e.to_string()));
            }
        }
        if self.json {
            print_json(&serde_json::json!({
                "matched": keys.len(),
                "done": keys.len() - failures.len(),
                "failed": failures.iter().map(|(k, e)| serde_json::json!({"key": k, "error": e})).collect::<Vec<_>>(),
            }));
        } else {
            for (key, error) in &failures {
                println!("{key}: {error}");
            }
            println!(
                "{verb}: {} of {} done",
                keys.len() - failures.len(),
                keys.len()
            );
        }
        Ok(if failures.is_empty() {
            exit::OK
        } else {
            exit::ERROR
        })
    }

    pub async fn wait(
        &self,
        key: v1::ActivityKey,
        timeout: Option<Duration>,
    ) -> Result<i32, Error> {
        let activity = self.client.wait(key, timeout).await?;
        self.print_activity(&activity);
        Ok(exit_for(&activity))
    }

    pub async fn cancel(&self, key: v1::ActivityKey, reason: String) -> Result<i32, Error> {
        let activity = self.client.cancel(key, reason).await?;
        self.print_activity(&activity);
        Ok(exit::OK)
    }

    pub async fn retry(&self, key: v1::ActivityKey) -> Result<i32, Error> {
        let activity = self.client.retry(key).await?;
        self.print_activity(&activity);
        Ok(exit::OK)
    }

    /// Lists up to `limit` activities, following page tokens; says how to go on
    /// when more match.
    pub async fn list(&self, request: v1::ListRequest, limit: usize) -> Result<i32, Error> {
        let (activities, next) = self.client.list_page_up_to(request, limit).await?;
        if self.json {
            print_json(&serde_json::json!({
                "activities": activities.iter().map(activity_json).collect::<Vec<_>>(),
                "next_page_token": next,
            }));
            return Ok(exit::OK);
        }
        let rows: Vec<Vec<String>> = activities
            .iter()
            .map(|a| {
                vec![
                    key_text(a.key.as_ref()),
                    a.activity_type.clone(),
                    status_label(a.status),
                    a.attempt.to_string(),
                    a.created_at.as_ref().map(format_time).unwrap_or_default(),
                    a.last_error.as_ref().map(short_error).unwrap_or_default(),
                ]
            })
            .collect();
        print!(
            "{}",
            table(
                &["KEY", "TYPE", "STATUS", "ATTEMPT", "CREATED", "LAST_ERROR"],
                &rows
            )
        );
        if !next.is_empty() {
            eprintln!("more match: add --page-token {next} for the next page, or --all");
        }
        Ok(exit::OK)
    }
}

/// How waiting for `activity` ends the command: it COMPLETED, finished otherwise,
/// or is not finished yet (the wait timed out).
fn exit_for(activity: &v1::Activity) -> i32 {
    match ActivityStatus::try_from(activity.status) {
        Ok(ActivityStatus::Completed) => exit::OK,
        Ok(ActivityStatus::Failed | ActivityStatus::Cancelled) => exit::NOT_COMPLETED,
        _ => exit::TIMEOUT,
    }
}

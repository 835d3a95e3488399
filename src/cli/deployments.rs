//! `driftless deployments`, `approve` and `reject`: through the daemon's
//! API with the token in `DRIFTLESS_TOKEN`, as a person's decisions are
//! recorded there.

use super::*;

/// Call the daemon's API with the token in DRIFTLESS_TOKEN.
pub(super) async fn api(
    app: &App,
    method: reqwest::Method,
    path: &str,
    body: Option<serde_json::Value>,
) -> Result<serde_json::Value, String> {
    let token = std::env::var("DRIFTLESS_TOKEN").map_err(|_| {
        "set DRIFTLESS_TOKEN to an API token (see `driftless token new`)".to_string()
    })?;
    let mut addr = app.settings().server.listen;
    if addr.port() == 0 {
        // The daemon chose its port: it noted it beside its PID.
        addr = crate::lock::serving_addr(&app.settings().state_dir).ok_or_else(|| {
            format!(
                "[server] listen asks for port 0 and no `driftless serve` is running on {}",
                app.settings().state_dir.display()
            )
        })?;
    }
    if addr.ip().is_unspecified() {
        addr.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
    }
    let url = format!("http://{addr}{path}");
    let client = reqwest::Client::builder()
        .timeout(std::time::Duration::from_secs(30))
        .build()
        .map_err(|e| format!("cannot build an HTTP client: {e}"))?;
    let mut req = client.request(method, &url).bearer_auth(token);
    if let Some(b) = body {
        req = req.json(&b);
    }
    let resp = req.send().await.map_err(|e| {
        format!(
            "cannot reach driftless at {url} (is `driftless serve` running?): {}",
            crate::error::chain(&e)
        )
    })?;
    let status = resp.status();
    let v: serde_json::Value = resp.json().await.unwrap_or(serde_json::Value::Null);
    if status.is_success() {
        Ok(v)
    } else {
        Err(format!(
            "{} {}: {}",
            status.as_u16(),
            status.canonical_reason().unwrap_or(""),
            v["error"].as_str().unwrap_or("(no message)")
        ))
    }
}

/// `driftless deployments [--pending]` (`--pending`: those waiting for a
/// person, to approve or to promote).
pub async fn deployments(app: &App, pending: bool, as_json: bool) -> Report {
    let paths: &[&str] = if pending {
        &[
            "/api/v1/deployments?state=pending_approval",
            "/api/v1/deployments?state=pending_promotion",
        ]
    } else {
        &["/api/v1/deployments"]
    };
    let mut all = Vec::new();
    for path in paths {
        match api(app, reqwest::Method::GET, path, None).await {
            Ok(serde_json::Value::Array(v)) => all.extend(v),
            Ok(_) => {}
            Err(e) => return failed(e),
        }
    }
    all.sort_by_key(|d| std::cmp::Reverse(d["id"].as_i64().unwrap_or(0)));
    let list = serde_json::Value::Array(all);
    if as_json {
        return Report {
            stdout: serde_json::to_string_pretty(&list).unwrap_or_default() + "\n",
            code: 0,
        };
    }
    let mut out = format!(
        "{:<6} {:<16} {:<14} {:<24} {:<17} {:<12} {}\n",
        "ID", "TARGET", "BACKEND", "JOB", "STATE", "COMMIT", "SUMMARY"
    );
    for d in list.as_array().into_iter().flatten() {
        let s = |k: &str| d[k].as_str().unwrap_or("-").to_string();
        let _ = writeln!(
            out,
            "{:<6} {:<16} {:<14} {:<24} {:<17} {:<12} {}{}",
            d["id"],
            s("target"),
            s("backend"),
            match d["job"].as_str() {
                Some(job) => format!("{}/{job}", s("namespace")),
                None => "-".into(),
            },
            s("state"),
            match s("commit").as_str() {
                "" => "-".to_string(),
                c => crate::model::short_sha(c).to_string(),
            },
            s("summary"),
            if d["destructive"] == true {
                " (destructive)"
            } else {
                ""
            }
        );
    }
    Report {
        stdout: out,
        code: 0,
    }
}

/// `driftless approve|reject <id>`: show what is decided, then decide it
/// (an approval names the plan shown: a plan that changed meanwhile is
/// refused by the API).
pub async fn approve_or_reject(app: &App, id: i64, approve: bool) -> Report {
    let d = match api(
        app,
        reqwest::Method::GET,
        &format!("/api/v1/deployments/{id}"),
        None,
    )
    .await
    {
        Ok(v) => v,
        Err(e) => return failed(e),
    };
    let what = match d["job"].as_str() {
        Some(job) => format!(
            "{}/{job} of target {}",
            d["namespace"].as_str().unwrap_or("?"),
            d["target"].as_str().unwrap_or("?")
        ),
        None => format!(
            "target {} ({})",
            d["target"].as_str().unwrap_or("?"),
            d["backend"].as_str().unwrap_or("?")
        ),
    };
    let mut out = format!(
        "deployment {id}: {what} at commit {}\n  {}{}\n",
        d["commit"].as_str().unwrap_or("?"),
        d["summary"].as_str().unwrap_or(""),
        if d["destructive"] == true {
            " (destructive: deletes or replaces)"
        } else {
            ""
        }
    );
    if let Some(diff) = d["diff"].as_str() {
        for line in diff.lines() {
            let _ = writeln!(out, "  {line}");
        }
    }
    let (verb, body) = if approve {
        (
            "approve",
            Some(serde_json::json!({ "plan_hash": d["plan_hash"] })),
        )
    } else {
        ("reject", None)
    };
    match api(
        app,
        reqwest::Method::POST,
        &format!("/api/v1/deployments/{id}/{verb}"),
        body,
    )
    .await
    {
        Ok(v) => {
            let _ = writeln!(out, "{verb}d: now {}", v["state"].as_str().unwrap_or("?"));
            Report {
                stdout: out,
                code: 0,
            }
        }
        Err(e) => {
            let mut r = failed(e);
            r.stdout = out + &r.stdout;
            r
        }
    }
}

/// `driftless reconcile TARGET [--now] [--wait D]`: queue a reconcile
/// through the daemon, `--now` outside the target's change window
/// (`override:<target>`); with `--wait`, its result (exit 1 when it failed).
pub async fn reconcile(app: &App, target: &str, now: bool, wait: Option<&str>) -> Report {
    let mut query = Vec::new();
    if now {
        query.push("override_window=1".to_string());
    }
    if let Some(w) = wait {
        query.push(format!(
            "wait={}",
            form_urlencoded::byte_serialize(w.as_bytes()).collect::<String>()
        ));
    }
    let path = format!(
        "/api/v1/targets/{target}/reconcile{}{}",
        if query.is_empty() { "" } else { "?" },
        query.join("&")
    );
    let v = match api(app, reqwest::Method::POST, &path, None).await {
        Ok(v) => v,
        Err(e) => return failed(e),
    };
    let run = &v["run"];
    if run.is_object() {
        let result = run["result"].as_str().unwrap_or("?");
        let failed_run = !matches!(result, "changed" | "no_change");
        return Report {
            stdout: format!(
                "{target}: {result} at {} (run {}, trigger {}): {}\n",
                run["sha"]
                    .as_str()
                    .map(crate::model::short_sha)
                    .unwrap_or("-"),
                run["id"],
                run["trigger"].as_str().unwrap_or("?"),
                run["message"].as_str().unwrap_or("")
            ),
            code: if failed_run { EXIT_FAILED } else { 0 },
        };
    }
    let job = v["job"].as_i64().or(v["id"].as_i64()).unwrap_or(0);
    let state = v["state"].as_str().unwrap_or("queued");
    Report {
        stdout: format!(
            "{target}: job {job} {state}{}\n",
            if now {
                " (trigger `override`: its change window does not hold it back)"
            } else {
                ""
            }
        ),
        code: 0,
    }
}

//! Deployments' builds: the source unpacked (or fetched with git), dependencies installed
//! and the entrypoint loaded in a sandbox, then the apps it defines published.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use chrono::Utc;
use tokio_util::sync::CancellationToken;

use super::runner::{self, AppRunner, Ended, Run};
use super::source::{self, Language};
use super::{
    AppDefinition, Apps, DeploymentDocument, DeploymentStatus, GitSource, NewDeployment, NewSource,
    base_env, is_label, loader, views,
};
use crate::error::{ServiceError, ServiceResult};
use crate::ids;
use crate::store::{AppVersionRecord, DeploymentRecord};

/// How long a build may take, dependencies included.
const BUILD_TIMEOUT: Duration = Duration::from_secs(15 * 60);
/// The build scripts, written into the build's run directory.
const PYTHON_BUILD: &str = include_str!("boot/build-python.sh");
const NODE_BUILD: &str = include_str!("boot/build-node.sh");
/// Fetches a git source.
const GIT_FETCH: &str = include_str!("boot/fetch-git.sh");
/// How long fetching a repository may take.
const GIT_FETCH_TIMEOUT: Duration = Duration::from_secs(5 * 60);

impl Apps {
    /// Unpacks an upload, records the deployment and starts its build.
    pub(super) async fn start_build(
        self: Arc<Self>, runner: Arc<AppRunner>, org_id: &str, new: NewDeployment, id: &str,
        cancel: CancellationToken,
    ) -> ServiceResult<DeploymentRecord> {
        let now = Utc::now();
        let mut document = DeploymentDocument {
            entrypoint_rel_path: new.entrypoint_rel_path.clone(),
            version: new.version.clone(),
            env_var_names: new.env_vars.keys().cloned().collect(),
            force: new.force,
            ..Default::default()
        };
        let dir = Self::deployment_dir(&runner, id);
        match &new.source {
            NewSource::Upload { archive, checksum } => {
                document.source_type = "file".into();
                document.source_checksum = Some(checksum.clone());
                let (archive, dir) = (archive.clone(), dir.clone());
                let entrypoint = new.entrypoint_rel_path.clone();
                tokio::task::spawn_blocking(move || unpack_upload(&archive, &dir, &entrypoint))
                    .await
                    .map_err(ServiceError::internal)??;
            }
            NewSource::Git(source) => {
                document.source_type = "github".into();
                document.source_url = Some(source.url.clone());
                document.source_ref = Some(source.git_ref.clone());
                document.source_path = source.path.clone();
                runner::traversable_dir(&dir).map_err(ServiceError::internal)?;
                std::fs::create_dir(dir.join("app")).map_err(ServiceError::internal)?;
            }
        }
        let inserted = match self.vault.seal(&new.env_vars, id) {
            Ok(sealed) => {
                let record = DeploymentRecord {
                    id: id.to_owned(),
                    org_id: org_id.to_owned(),
                    status: DeploymentStatus::Queued.as_str().into(),
                    created_at: now,
                    updated_at: now,
                    document: serde_json::to_string(&document).unwrap_or_default(),
                    sealed: Some(sealed),
                    project_id: None,
                };
                self.store.insert_deployment(&record).await.map(|()| record).map_err(Into::into)
            }
            Err(error) => Err(ServiceError::Internal(error)),
        };
        let record = match inserted {
            Ok(record) => record,
            Err(error) => {
                let _ = tokio::fs::remove_dir_all(&dir).await;
                return Err(error);
            }
        };
        self.events.push(id, views::deployment_state_event(&record), false);
        let git = match new.source {
            NewSource::Git(source) => Some(source),
            NewSource::Upload { .. } => None,
        };
        tokio::spawn(self.clone().build(runner, record.clone(), document, git, cancel));
        Ok(record)
    }

    /// Builds a deployment to its end: `running` with its apps published, or `failed`
    /// with a reason (the installer's or loader's own words are in its events).
    async fn build(
        self: Arc<Self>, runner: Arc<AppRunner>, mut record: DeploymentRecord,
        mut document: DeploymentDocument, git: Option<GitSource>, cancel: CancellationToken,
    ) {
        let id = record.id.clone();
        self.set_deployment_status(&mut record, &document, DeploymentStatus::InProgress).await;
        let outcome = self.build_steps(&runner, &record, &mut document, git, cancel).await;
        let published = match outcome {
            Ok(()) => self.publish(&record, &document).await,
            Err(reason) => Err(reason),
        };
        if let Ok(mut builds) = self.builds.lock() {
            builds.remove(&id);
        }
        let status = match published {
            Ok(published) => {
                for (app, definition) in published.iter().zip(&document.apps) {
                    self.events.push(&id, views::app_version_summary_event(app, definition), false);
                }
                DeploymentStatus::Running
            }
            Err(reason) => {
                document.status_reason = Some(reason);
                DeploymentStatus::Failed
            }
        };
        self.set_deployment_status(&mut record, &document, status).await;
    }

    pub(super) async fn set_deployment_status(
        &self, record: &mut DeploymentRecord, document: &DeploymentDocument,
        status: DeploymentStatus,
    ) {
        record.status = status.as_str().into();
        record.updated_at = Utc::now();
        record.document = serde_json::to_string(document).unwrap_or_default();
        match self.store.update_deployment(record).await {
            Ok(true) => {}
            // Deleted while it was built: what it may have published goes too, and
            // nothing more is told.
            Ok(false) => {
                let _ = self.store.delete_app_versions(&record.org_id, &record.id).await;
                self.events.forget(&record.id);
                return;
            }
            Err(error) => {
                tracing::error!(deployment_id = %record.id, %error, "recording a deployment's status failed");
            }
        }
        self.events.push(&record.id, views::deployment_state_event(record), status.is_final());
    }

    async fn build_steps(
        &self, runner: &AppRunner, record: &DeploymentRecord, document: &mut DeploymentDocument,
        git: Option<GitSource>, cancel: CancellationToken,
    ) -> Result<(), String> {
        let dir = Self::deployment_dir(runner, &record.id);
        let app_dir = dir.join("app");
        let owner = runner.vm_user().map(|user| (user.uid, user.gid));
        let cache = runner.apps_dir.join("cache").join(&record.org_id);
        runner::traversable_dir(&cache).map_err(|error| format!("internal error: {error}"))?;
        if let Some(owner) = owner {
            let tree = app_dir.clone();
            tokio::task::spawn_blocking(move || source::chown_tree(&tree, owner))
                .await
                .map_err(|error| error.to_string())
                .and_then(|chowned| chowned.map_err(|error| error.to_string()))
                .map_err(|error| format!("internal error: {error}"))?;
            std::os::unix::fs::lchown(&cache, Some(owner.0), Some(owner.1))
                .map_err(|error| format!("internal error: {error}"))?;
        }
        if let Some(source) = git {
            let (commit, checksum) =
                self.fetch_git(runner, record, &app_dir, &source, &cancel).await?;
            document.source_checksum = Some(checksum);
            tracing::info!(deployment_id = %record.id, commit, "fetched a git source");
            if !is_plain_file(&app_dir, &document.entrypoint_rel_path) {
                return Err(format!(
                    "the repository has no file {} at {}",
                    document.entrypoint_rel_path, source.git_ref
                ));
            }
        }
        let language = Language::of(&document.entrypoint_rel_path)
            .ok_or("the entrypoint's language is not supported")?;
        let (_, mut files) = loader(language);
        let build = match language {
            Language::Python => PYTHON_BUILD,
            Language::Node => NODE_BUILD,
        };
        files.push(("build.sh", build.as_bytes().to_vec()));
        let script = "/run/app/build.sh";
        let mut env = base_env();
        env.push(("PIP_CACHE_DIR".into(), "/run/cache/pip".into()));
        env.push(("npm_config_cache".into(), "/run/cache/npm".into()));
        env.push(("npm_config_update_notifier".into(), "false".into()));
        // Apps commonly make their client when loaded; it needs a key to be made, not
        // one that works.
        env.push(("KERNEL_API_KEY".into(), "build-time-placeholder".into()));
        env.extend(package_manager_env());
        let run = Run {
            app_dir: &app_dir,
            app_writable: true,
            cache: Some(&cache),
            program: ("/bin/sh", vec![script.into(), document.entrypoint_rel_path.clone().into()]),
            env,
            files,
            timeout: BUILD_TIMEOUT,
            cancel,
            allowed_hosts: None,
        };
        let outcome = self.run_logged(runner, &record.id, run).await;
        match outcome.ended {
            Ended::Exited(0) => {}
            Ended::Exited(code) => {
                return Err(format!(
                    "the build failed (exit code {code}): its output is in the deployment's events"
                ));
            }
            Ended::TimedOut => {
                return Err(format!(
                    "the build took longer than {} minutes",
                    BUILD_TIMEOUT.as_secs() / 60
                ));
            }
            Ended::Cancelled => return Err("the deployment was deleted".into()),
            Ended::OutOfMemory => {
                return Err(format!(
                    "the build used more memory than its limit ({} MiB)",
                    runner::MEMORY_LIMIT_MIB
                ));
            }
            Ended::NotStarted(why) => {
                tracing::error!(deployment_id = %record.id, why, "an app build could not start");
                return Err("internal error: the build's sandbox could not start".into());
            }
        }
        let described: serde_json::Value = match outcome.result {
            Some(Ok(bytes)) => serde_json::from_slice(&bytes)
                .map_err(|_| "the loader's answer is not JSON".to_string())?,
            Some(Err(problem)) => return Err(problem),
            None => return Err("loading the entrypoint gave no answer".into()),
        };
        if described["ok"] != true {
            let error = described["error"].as_str().unwrap_or("unknown error");
            self.events.push(&record.id, views::log_event(error), false);
            return Err(format!(
                "loading {} failed: {}",
                document.entrypoint_rel_path,
                last_line(error)
            ));
        }
        let apps: Vec<AppDefinition> = serde_json::from_value(described["apps"].clone())
            .map_err(|_| "the loader's answer has no apps".to_string())?;
        if apps.is_empty() {
            return Err(format!(
                "{} defines no app: create one with the SDK's app framework (kernel.App(\"name\"))",
                document.entrypoint_rel_path
            ));
        }
        for app in &apps {
            if !is_label(&app.name) {
                return Err(format!(
                    "app name {:?}: 1 to 64 letters, digits, `.`, `_` or `-`",
                    app.name
                ));
            }
            if let Some(action) = app.actions.iter().find(|action| !is_label(action)) {
                return Err(format!(
                    "action name {action:?}: 1 to 64 letters, digits, `.`, `_` or `-`"
                ));
            }
        }
        document.apps = apps;
        Ok(())
    }

    /// Fetches a git source into the (empty) app directory, in a sandbox whose only way
    /// out is the egress proxy; answers the commit and a checksum of its files.
    async fn fetch_git(
        &self, runner: &AppRunner, record: &DeploymentRecord, app_dir: &Path, source: &GitSource,
        cancel: &CancellationToken,
    ) -> Result<(String, String), String> {
        let mut env = base_env();
        env.extend(package_manager_env());
        env.push(("SOURCE_URL".into(), source.url.clone()));
        env.push(("SOURCE_REF".into(), source.git_ref.clone()));
        env.push(("SOURCE_PATH".into(), source.path.clone().unwrap_or_default()));
        env.push(("GIT_TERMINAL_PROMPT".into(), "0".into()));
        if let Some(token) = &source.token {
            // In git's configuration from the environment: never on a command line.
            let basic =
                base64::engine::general_purpose::STANDARD.encode(format!("x-access-token:{token}"));
            env.push(("GIT_CONFIG_COUNT".into(), "1".into()));
            env.push(("GIT_CONFIG_KEY_0".into(), "http.extraHeader".into()));
            env.push(("GIT_CONFIG_VALUE_0".into(), format!("Authorization: Basic {basic}")));
        }
        let outcome = self
            .run_logged(
                runner,
                &record.id,
                Run {
                    app_dir,
                    app_writable: true,
                    cache: None,
                    program: ("/bin/sh", vec!["/run/app/fetch.sh".into()]),
                    env,
                    files: vec![("fetch.sh", GIT_FETCH.as_bytes().to_vec())],
                    timeout: GIT_FETCH_TIMEOUT,
                    cancel: cancel.clone(),
                    allowed_hosts: None,
                },
            )
            .await;
        match (outcome.ended, outcome.result) {
            (Ended::Exited(0), Some(Ok(bytes))) => {
                let result: serde_json::Value =
                    serde_json::from_slice(&bytes).map_err(|_| "fetching gave no answer")?;
                let text = |name: &str| result[name].as_str().unwrap_or_default().to_owned();
                Ok((text("commit"), text("checksum")))
            }
            (Ended::Cancelled, _) => Err("the deployment was deleted".into()),
            (Ended::TimedOut, _) => Err(format!(
                "fetching the repository took longer than {} minutes",
                GIT_FETCH_TIMEOUT.as_secs() / 60
            )),
            _ => Err(format!(
                "fetching {} at {} failed: git's words are in the deployment's events",
                source.url, source.git_ref
            )),
        }
    }

    /// Publishes the deployment's apps at its version. Another deployment's app at the
    /// same version is replaced (and that deployment stopped) only with `force`.
    async fn publish(
        &self, record: &DeploymentRecord, document: &DeploymentDocument,
    ) -> Result<Vec<AppVersionRecord>, String> {
        let internal = |error: crate::store::StoreError| {
            tracing::error!(deployment_id = %record.id, %error, "publishing apps failed");
            "internal error while publishing the apps".to_string()
        };
        for app in &document.apps {
            let existing = self
                .store
                .app_version(&record.org_id, &app.name, &document.version)
                .await
                .map_err(internal)?;
            if let Some(existing) = existing {
                if !document.force {
                    return Err(format!(
                        "app {} version {} is already deployed ({}): deploy with force to replace it",
                        app.name, document.version, existing.deployment_id
                    ));
                }
                self.stop_deployment(&record.org_id, &existing.deployment_id).await;
            }
        }
        let now = Utc::now();
        let mut published = Vec::new();
        for app in &document.apps {
            let version = AppVersionRecord {
                id: ids::new_id("app"),
                org_id: record.org_id.clone(),
                app_name: app.name.clone(),
                version: document.version.clone(),
                deployment_id: record.id.clone(),
                actions: serde_json::to_string(&app.actions).unwrap_or_default(),
                created_at: now,
                project_id: record.project_id.clone(),
            };
            if let Err(error) = self.store.insert_app_version(&version).await {
                let _ = self.store.delete_app_versions(&record.org_id, &record.id).await;
                return match error {
                    crate::store::StoreError::Conflict(_) => Err(format!(
                        "app {} version {} was deployed by another deployment meanwhile",
                        app.name, document.version
                    )),
                    other => Err(internal(other)),
                };
            }
            published.push(version);
        }
        Ok(published)
    }

    /// Stops a running deployment that another replaced: its apps are unpublished and its
    /// running invocations end.
    async fn stop_deployment(&self, org_id: &str, deployment_id: &str) {
        let _ = self.store.delete_app_versions(org_id, deployment_id).await;
        self.invocations.cancel_of_deployment(deployment_id, "its deployment was replaced");
        if let Ok(Some(mut record)) = self.store.deployment(org_id, deployment_id).await {
            let mut document = DeploymentDocument::of(&record);
            document.status_reason =
                Some("replaced by a newer deployment of the same app version".into());
            self.set_deployment_status(&mut record, &document, DeploymentStatus::Stopped).await;
        }
    }
}

/// The operator's package manager settings (a private index, a CA bundle), passed to
/// builds as they are in this service's environment. App code runs in builds (a
/// `setup.py`, the entrypoint being loaded), so an index URL that carries credentials is
/// not passed (and the operator is told once).
fn package_manager_env() -> Vec<(String, String)> {
    const PASSED: &[&str] = &[
        "PIP_INDEX_URL",
        "PIP_EXTRA_INDEX_URL",
        "PIP_TRUSTED_HOST",
        "PIP_CERT",
        "PIP_DEFAULT_TIMEOUT",
        "NPM_CONFIG_REGISTRY",
        "npm_config_registry",
        "NPM_CONFIG_CAFILE",
        "npm_config_cafile",
        "NODE_EXTRA_CA_CERTS",
        "SSL_CERT_FILE",
        "SSL_CERT_DIR",
        "REQUESTS_CA_BUNDLE",
        "GIT_SSL_CAINFO",
    ];
    static WARNED: std::sync::Once = std::sync::Once::new();
    PASSED
        .iter()
        .filter_map(|name| {
            let value = std::env::var(name).ok()?;
            if carries_credentials(&value) {
                WARNED.call_once(|| {
                    tracing::warn!(
                        variable = name,
                        "a package index URL with credentials is not passed to app builds \
                         (app code runs there): give the index's credentials another way"
                    );
                });
                return None;
            }
            Some((name.to_string(), value))
        })
        .collect()
}

/// Whether a setting holds a URL with a user name or password in it.
pub(super) fn carries_credentials(value: &str) -> bool {
    value.split_whitespace().any(|part| {
        url::Url::parse(part)
            .is_ok_and(|url| !url.username().is_empty() || url.password().is_some())
    })
}

/// Unpacks an uploaded archive into `<dir>/app` (the archive is removed); the
/// deployment's directory is removed again when the archive is refused.
fn unpack_upload(archive: &Path, dir: &Path, entrypoint: &str) -> ServiceResult<()> {
    let app = dir.join("app");
    runner::traversable_dir(dir).map_err(ServiceError::internal)?;
    std::fs::create_dir(&app).map_err(ServiceError::internal)?;
    let unpacked = std::fs::File::open(archive)
        .map_err(|error| error.to_string())
        .and_then(|file| source::unpack_zip(std::io::BufReader::new(file), &app));
    let _ = std::fs::remove_file(archive);
    let problem = match unpacked {
        Err(problem) => Some(format!("file: {problem}")),
        Ok(()) if !is_plain_file(&app, entrypoint) => {
            Some(format!("entrypoint_rel_path: the archive has no file {entrypoint}"))
        }
        Ok(()) => None,
    };
    match problem {
        Some(problem) => {
            let _ = std::fs::remove_dir_all(dir);
            Err(ServiceError::invalid(problem))
        }
        None => Ok(()),
    }
}

/// `relative` in `base` is a regular file reached through no link (this process is not
/// sandboxed: it must not follow what an app's files point at).
fn is_plain_file(base: &Path, relative: &str) -> bool {
    let mut path = base.to_owned();
    let components: Vec<_> = Path::new(relative).components().collect();
    for (index, component) in components.iter().enumerate() {
        path.push(component);
        let Ok(metadata) = std::fs::symlink_metadata(&path) else {
            return false;
        };
        let last = index + 1 == components.len();
        if metadata.file_type().is_symlink() || (last && !metadata.is_file()) {
            return false;
        }
    }
    !components.is_empty()
}

/// The last non-empty line of a traceback: the exception itself.
fn last_line(text: &str) -> &str {
    text.lines().rev().find(|line| !line.trim().is_empty()).unwrap_or(text).trim()
}

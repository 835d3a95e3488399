//! For tests only (the unit tests and `tests/it`; nothing in the daemon or
//! the CLI calls it): a throwaway PostgreSQL cluster (Debian's `postgresql`
//! package), one per test process, and a fresh database in it per test.
//!
//! `initdb` makes the cluster in a temporary directory as the `postgres`
//! user (PostgreSQL refuses to run as root); the server listens on a Unix
//! socket in that directory only, never on TCP. It lives as long as the
//! test process: a shell waits for its stdin (a pipe this process holds)
//! to close, then stops the server (`pg_ctl stop`: `runuser` does not pass signals on) and removes
//! the directory. This module
//! must not be used outside tests.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

struct Cluster {
    socket_dir: PathBuf,
    /// The shell that stops the server when its stdin closes.
    _keeper: Child,
}

/// The directory holding PostgreSQL's programs (`initdb`, `postgres`).
fn bin_dir() -> Result<PathBuf, String> {
    if let Some(dir) = std::env::var_os("DRIFTLESS_PG_BIN") {
        return Ok(PathBuf::from(dir));
    }
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map_err(|e| format!("/usr/lib/postgresql: {e} (install Debian's postgresql)"))?
        .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
        .filter(|p| p.join("initdb").exists())
        .collect();
    found.sort();
    found
        .pop()
        .ok_or_else(|| "no /usr/lib/postgresql/*/bin/initdb (install postgresql)".into())
}

fn run(cmd: &mut Command) -> Result<(), String> {
    let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{cmd:?}: {}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// A new cluster in `dir/data`, `dir` handed to the `postgres` user.
fn initdb(bin: &Path, dir: &Path) -> Result<(), String> {
    run(Command::new("chown").arg("postgres:").arg(dir))?;
    run(Command::new("runuser")
        .args(["-u", "postgres", "--"])
        .arg(bin.join("initdb"))
        .args([
            "-U",
            "postgres",
            "--auth=trust",
            "-E",
            "UTF8",
            "--no-sync",
            "-D",
        ])
        .arg(dir.join("data")))
}

fn start() -> Result<Cluster, String> {
    let bin = bin_dir()?;
    static N: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "driftless-pg-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    initdb(&bin, &dir)?;
    let data = dir.join("data");
    // fsync off: these tests check what driftless writes and reads, not
    // PostgreSQL's own durability; it makes every commit cheap.
    let script = format!(
        "runuser -u postgres -- '{postgres}' -D '{data}' -k '{dir}' -c listen_addresses= \
         -c fsync=off -c max_connections=300 >'{dir}/log' 2>&1 & pid=$!; \
         cat >/dev/null; runuser -u postgres -- '{pg_ctl}' -D '{data}' -m immediate stop; \
         wait $pid; rm -rf '{dir}'",
        pg_ctl = bin.join("pg_ctl").display(),
        postgres = bin.join("postgres").display(),
        data = data.display(),
        dir = dir.display(),
    );
    let mut keeper = Command::new("sh")
        .args(["-c", &script])
        .stdin(Stdio::piped())
        // Not the test's own output: whoever reads it would wait for the
        // cluster to stop too.
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("starting postgres: {e}"))?;
    let socket = dir.join(".s.PGSQL.5432");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !socket.exists() {
        if Instant::now() > deadline || keeper.try_wait().ok().flatten().is_some() {
            let log = std::fs::read_to_string(dir.join("log")).unwrap_or_default();
            return Err(format!(
                "postgres did not start in {}:\n{log}",
                dir.display()
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    // The socket appears before the server takes connections ("the
    // database system is starting up"): wait until it answers.
    loop {
        let ready = Command::new(bin.join("pg_isready"))
            .arg("-q")
            .arg("-h")
            .arg(&dir)
            .status()
            .is_ok_and(|s| s.success());
        if ready {
            break;
        }
        if Instant::now() > deadline {
            let log = std::fs::read_to_string(dir.join("log")).unwrap_or_default();
            return Err(format!(
                "postgres did not take connections in {}:\n{log}",
                dir.display()
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    // The pipe stays open for the life of the process: its writer is
    // never closed.
    std::mem::forget(keeper.stdin.take());
    Ok(Cluster {
        socket_dir: dir,
        _keeper: keeper,
    })
}

fn cluster() -> &'static Cluster {
    static CLUSTER: OnceLock<Cluster> = OnceLock::new();
    CLUSTER.get_or_init(|| match start() {
        Ok(c) => c,
        Err(e) => panic!("a throwaway PostgreSQL cluster: {e}"),
    })
}

fn url(socket_dir: &Path, db: &str) -> String {
    format!(
        "postgres://postgres@localhost/{db}?host={}",
        socket_dir.display()
    )
}

/// The URL of a new, empty database in this process's cluster.
pub async fn database() -> String {
    use sqlx::Connection;
    static N: AtomicU64 = AtomicU64::new(0);
    let socket_dir = tokio::task::spawn_blocking(|| cluster().socket_dir.clone())
        .await
        .expect("cluster");
    sqlx::any::install_default_drivers();
    let name = format!("t{}", N.fetch_add(1, Ordering::Relaxed));
    let mut conn = sqlx::AnyConnection::connect(&url(&socket_dir, "postgres"))
        .await
        .expect("connect to the cluster");
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .execute(&mut conn)
        .await
        .expect("create database");
    url(&socket_dir, &name)
}

/// Run `sql` (statements separated by `;`) on the database at `url`; on
/// the cluster's `postgres` database when `url` is None.
pub async fn execute(url: Option<&str>, sql: &str) {
    use sqlx::Connection;
    sqlx::any::install_default_drivers();
    let url = match url {
        Some(u) => u.to_string(),
        None => {
            let socket_dir = tokio::task::spawn_blocking(|| cluster().socket_dir.clone())
                .await
                .expect("cluster");
            self::url(&socket_dir, "postgres")
        }
    };
    let mut conn = sqlx::AnyConnection::connect(&url)
        .await
        .expect("connect to the cluster");
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_string()))
        .execute(&mut conn)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

/// A store on SQLite in `dir`, and one on a new PostgreSQL database: a
/// test runs its body on each.
pub async fn stores(dir: &Path) -> Vec<super::Store> {
    let sqlite = super::Store::open(&dir.join("driftless.db"))
        .await
        .expect("sqlite store");
    let pg = super::Store::open_postgres(&database().await)
        .await
        .expect("postgres store");
    vec![sqlite, pg]
}

/// A store on SQLite in `dir` (a file of its own) that writes everything
/// through sqlx, as PostgreSQL does: no write on SQLite's write thread
/// (`store::direct`). Beside [`stores`], it shows a kind's direct job
/// writes what its sqlx statements write.
pub async fn sqlite_through_sqlx(dir: &Path) -> super::Store {
    let store = super::Store::open(&dir.join("through-sqlx.db"))
        .await
        .expect("sqlite store");
    super::Store {
        direct: None,
        group: Default::default(),
        ..store
    }
}

/// A cluster of one test's own, which the test may stop (as a crash:
/// `pg_ctl -m immediate`) and start again; the shared one stays up for the
/// other tests. Stopped and removed when dropped.
pub struct OwnCluster {
    dir: PathBuf,
    bin: PathBuf,
    /// With TLS: the loopback TCP port it also listens on.
    tls_port: Option<u16>,
}

impl OwnCluster {
    /// `initdb` and start a new cluster.
    pub fn new() -> OwnCluster {
        OwnCluster::made(None, |_| Ok(()))
    }

    /// `initdb` and start a new cluster that also listens on a loopback
    /// TCP port, taking TLS connections only there (`hostnossl … reject`),
    /// with the server certificate `cert` and its key `key`.
    pub fn with_tls(cert: &Path, key: &Path) -> OwnCluster {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .unwrap_or_else(|e| panic!("a free port: {e}"));
        OwnCluster::made(Some(port), |data| {
            let hba = data.join("pg_hba.conf");
            let old = std::fs::read_to_string(&hba).map_err(|e| e.to_string())?;
            std::fs::write(&hba, format!("hostnossl all all all reject\n{old}"))
                .map_err(|e| e.to_string())?;
            for (from, to) in [(cert, "server.crt"), (key, "server.key")] {
                std::fs::copy(from, data.join(to)).map_err(|e| format!("{to}: {e}"))?;
            }
            run(Command::new("chown")
                .arg("postgres:")
                .arg(data.join("server.crt"))
                .arg(data.join("server.key")))?;
            run(Command::new("chmod")
                .arg("600")
                .arg(data.join("server.key")))
        })
    }

    /// `initdb` a new cluster, `prepare` its data directory, start it.
    fn made(
        tls_port: Option<u16>,
        prepare: impl FnOnce(&Path) -> Result<(), String>,
    ) -> OwnCluster {
        let bin = bin_dir().unwrap_or_else(|e| panic!("a PostgreSQL cluster: {e}"));
        static N: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "driftless-pg-own-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let made = std::fs::create_dir_all(&dir)
            .map_err(|e| format!("{}: {e}", dir.display()))
            .and_then(|()| initdb(&bin, &dir))
            .and_then(|()| prepare(&dir.join("data")));
        if let Err(e) = made {
            panic!("a PostgreSQL cluster: {e}");
        }
        let c = OwnCluster { dir, bin, tls_port };
        c.start();
        c
    }

    /// The URL of database `db` over TCP (a cluster made `with_tls`).
    pub fn tcp_url(&self, db: &str) -> String {
        let port = self.tls_port.unwrap_or(5432);
        format!("postgres://postgres@127.0.0.1:{port}/{db}")
    }

    fn pg_ctl(&self, args: &[&str]) -> Result<(), String> {
        run(Command::new("runuser")
            .args(["-u", "postgres", "--"])
            .arg(self.bin.join("pg_ctl"))
            .arg("-D")
            .arg(self.dir.join("data"))
            .args(args))
    }

    /// Start the server and wait until it takes connections.
    pub fn start(&self) {
        let listen = match self.tls_port {
            Some(port) => format!("-p {port} -c listen_addresses=127.0.0.1 -c ssl=on"),
            None => "-c listen_addresses=".to_string(),
        };
        let options = format!(
            "-k '{}' {listen} -c fsync=off -c max_connections=100",
            self.dir.display()
        );
        let log = self.dir.join("log");
        if let Err(e) = self.pg_ctl(&["-o", &options, "-l", &log.to_string_lossy(), "-w", "start"])
        {
            let log = std::fs::read_to_string(&log).unwrap_or_default();
            panic!("starting postgres: {e}\n{log}");
        }
    }

    /// Stop the server at once, as if it crashed.
    pub fn crash(&self) {
        if let Err(e) = self.pg_ctl(&["-m", "immediate", "-w", "stop"]) {
            panic!("stopping postgres: {e}");
        }
    }

    /// The URL of database `db` (made by [`OwnCluster::create`]).
    pub fn url(&self, db: &str) -> String {
        match self.tls_port {
            // The socket's name carries the port.
            Some(port) => format!(
                "postgres://postgres@localhost:{port}/{db}?host={}",
                self.dir.display()
            ),
            None => url(&self.dir, db),
        }
    }

    /// Make database `db`; returns its URL.
    pub fn create(&self, db: &str) -> String {
        let admin = self.url("postgres");
        let sql = format!("CREATE DATABASE {db}");
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
            .block_on(execute(Some(&admin), &sql));
        self.url(db)
    }
}

impl Drop for OwnCluster {
    fn drop(&mut self) {
        let _ = self.pg_ctl(&["-m", "immediate", "stop"]);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Default for OwnCluster {
    fn default() -> OwnCluster {
        OwnCluster::new()
    }
}

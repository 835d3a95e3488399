//! Email over SMTP with lettre: STARTTLS, implicit TLS, or (loopback hosts
//! only) none; a plain-text body and a subject naming target, result and
//! short SHA. Errors never include the password.

use std::time::Duration;

use lettre::message::{Mailbox, header::ContentType};
use lettre::transport::smtp::authentication::Credentials;
use lettre::{AsyncSmtpTransport, AsyncTransport, Message, Tokio1Executor};

use super::{EmailConfig, EventDoc, SendError, Tls};

pub(super) async fn send(
    cfg: &EmailConfig,
    password: Option<String>,
    doc: &EventDoc,
) -> Result<(), SendError> {
    let mailbox = |a: &str| -> Result<Mailbox, SendError> {
        a.parse()
            .map_err(|e| SendError::new(format!("`{a}` is not a usable address: {e}")))
    };
    let mut msg = Message::builder()
        .from(mailbox(&cfg.from)?)
        .subject(format!("[driftless] {}", doc.headline()))
        .header(ContentType::TEXT_PLAIN);
    for to in &cfg.to {
        msg = msg.to(mailbox(to)?);
    }
    let msg = msg
        .body(doc.text())
        .map_err(|e| SendError::new(format!("cannot build the message: {e}")))?;

    let smtp_err = |e: lettre::transport::smtp::Error| {
        SendError::new(format!("SMTP: {}", crate::error::chain(&e)))
    };
    let builder = match cfg.tls {
        Tls::Starttls => {
            AsyncSmtpTransport::<Tokio1Executor>::starttls_relay(&cfg.host).map_err(smtp_err)?
        }
        Tls::Tls => AsyncSmtpTransport::<Tokio1Executor>::relay(&cfg.host).map_err(smtp_err)?,
        Tls::None => AsyncSmtpTransport::<Tokio1Executor>::builder_dangerous(&cfg.host),
    };
    let port = cfg.port.unwrap_or(match cfg.tls {
        Tls::Starttls => 587,
        Tls::Tls => 465,
        Tls::None => 25,
    });
    let mut builder = builder.port(port).timeout(Some(Duration::from_secs(30)));
    if let (Some(user), Some(pass)) = (&cfg.username, password) {
        builder = builder.credentials(Credentials::new(user.clone(), pass));
    }
    let transport = builder.build();
    transport.send(msg).await.map(|_| ()).map_err(smtp_err)
}

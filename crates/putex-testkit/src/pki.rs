//! A throwaway certificate authority for the TLS tests: a CA, a server
//! certificate for `127.0.0.1` and `localhost` (usable as a client's too:
//! etcd's own gateway dials its server with it) and a client certificate,
//! written as PEM files into a directory the caller owns.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose as Eku, IsCa, Issuer,
    KeyPair, KeyUsagePurpose,
};

/// The PEM files of one throwaway CA and its two leaves.
pub struct Pki {
    /// The CA certificate (`ca.pem`).
    pub ca: PathBuf,
    /// The server certificate (`server.pem`) and key (`server.key`).
    pub server_cert: PathBuf,
    /// See `server_cert`.
    pub server_key: PathBuf,
    /// The client certificate (`client.pem`) and key (`client.key`).
    pub client_cert: PathBuf,
    /// See `client_cert`.
    pub client_key: PathBuf,
}

impl Pki {
    /// Makes the CA and certificates in `dir`; the client certificate's
    /// common name is `client_cn` (etcd maps it to a user).
    pub fn new(dir: &Path, client_cn: &str) -> Pki {
        let ca_key = KeyPair::generate().expect("a CA key");
        let mut ca = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        ca.distinguished_name
            .push(DnType::CommonName, "putex test CA");
        let ca_cert = ca.self_signed(&ca_key).expect("a self-signed CA");
        let issuer = Issuer::new(ca, ca_key);
        let leaf = |names: Vec<String>, cn: &str, usages: Vec<Eku>| {
            let key = KeyPair::generate().expect("a key");
            let mut p = CertificateParams::new(names).expect("leaf parameters");
            p.distinguished_name.push(DnType::CommonName, cn);
            p.extended_key_usages = usages;
            let cert = p.signed_by(&key, &issuer).expect("a signed leaf");
            (cert.pem(), key.serialize_pem())
        };
        let (server_pem, server_key) = leaf(
            vec!["127.0.0.1".into(), "localhost".into()],
            "putex test server",
            vec![Eku::ServerAuth, Eku::ClientAuth],
        );
        let (client_pem, client_key) = leaf(vec![], client_cn, vec![Eku::ClientAuth]);
        let write = |name: &str, text: &str| {
            let p = dir.join(name);
            std::fs::write(&p, text).expect("write a PEM file");
            p
        };
        Pki {
            ca: write("ca.pem", &ca_cert.pem()),
            server_cert: write("server.pem", &server_pem),
            server_key: write("server.key", &server_key),
            client_cert: write("client.pem", &client_pem),
            client_key: write("client.key", &client_key),
        }
    }
}

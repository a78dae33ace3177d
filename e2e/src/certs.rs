//! The cluster's PKI, generated in pure Rust (rcgen, ECDSA P-256).
//!
//! Only what a token-authenticated loopback cluster needs: a CA, the
//! apiserver's serving certificate, and the service-account signing key.
//! Clients authenticate with a static token, so there are no client certs.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

use crate::error::{io, Result};

/// File paths of the written PKI.
#[derive(Debug, Clone)]
pub struct Pki {
    /// CA certificate (PEM); the apiserver's `--client-ca-file`, the
    /// kubeconfig's `certificate-authority`, the controller-manager's
    /// `--root-ca-file`.
    pub ca_cert: PathBuf,
    /// Serving certificate of the apiserver, SANs 127.0.0.1, the real node's
    /// host address, localhost and the in-cluster `kubernetes` Service names.
    pub apiserver_cert: PathBuf,
    pub apiserver_key: PathBuf,
    /// Service-account signing key, PKCS#8 PEM.
    pub sa_key: PathBuf,
    /// Its public half as SPKI PEM. The apiserver's `--service-account-key-file`
    /// must get this, not the private key: client-go's public-key parser only
    /// recognises EC *private* keys in SEC1 form, not PKCS#8.
    pub sa_pub: PathBuf,
}

impl Pki {
    /// Generates a fresh PKI into `dir` (which must exist).
    pub fn generate(dir: &Path) -> Result<Pki> {
        let ca_key = KeyPair::generate()?;
        let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "csiops-e2e-ca");
        ca_params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_cert = ca_params.self_signed(&ca_key)?;
        let ca = Issuer::new(ca_params, ca_key);

        let server_key = KeyPair::generate()?;
        let host_ip = crate::realnode::HOST_IP.to_string();
        let mut server_params = CertificateParams::new(
            [
                "127.0.0.1",
                host_ip.as_str(),
                "localhost",
                "10.96.0.1",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            ]
            .map(String::from)
            .to_vec(),
        )?;
        server_params
            .distinguished_name
            .push(DnType::CommonName, "kube-apiserver");
        server_params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        server_params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        server_params.use_authority_key_identifier_extension = true;
        let server_cert = server_params.signed_by(&server_key, &ca)?;

        let sa_key = KeyPair::generate()?;

        let pki = Pki {
            ca_cert: dir.join("ca.crt"),
            apiserver_cert: dir.join("apiserver.crt"),
            apiserver_key: dir.join("apiserver.key"),
            sa_key: dir.join("sa.key"),
            sa_pub: dir.join("sa.pub"),
        };
        write(&pki.ca_cert, &ca_cert.pem())?;
        write(&pki.apiserver_cert, &server_cert.pem())?;
        write(&pki.apiserver_key, &server_key.serialize_pem())?;
        write(&pki.sa_key, &sa_key.serialize_pem())?;
        write(&pki.sa_pub, &sa_key.public_key_pem())?;
        Ok(pki)
    }
}

fn write(path: &Path, pem: &str) -> Result<()> {
    std::fs::write(path, pem).map_err(io("writing PEM", path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_pem_files() {
        let dir = tempfile::tempdir().unwrap();
        let pki = Pki::generate(dir.path()).unwrap();
        let read = |p: &Path| std::fs::read_to_string(p).unwrap();
        assert!(read(&pki.ca_cert).starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(read(&pki.apiserver_cert).starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(read(&pki.apiserver_key).starts_with("-----BEGIN PRIVATE KEY-----"));
        assert!(read(&pki.sa_key).starts_with("-----BEGIN PRIVATE KEY-----"));
        assert!(read(&pki.sa_pub).starts_with("-----BEGIN PUBLIC KEY-----"));
    }
}

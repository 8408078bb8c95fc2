//! The names in a client certificate that can identify it: the subject's common name (CN)
//! and the subject alternative names (DNS, URI, e-mail). Read from the DER of a certificate
//! rustls has already verified, with a bounds-checked walk of the few structures on the way
//! (a full X.509 parser would be a dependency for four fields); anything unexpected yields
//! fewer names, never a panic.

/// OID 2.5.4.3, the common name, as DER content bytes.
const OID_CN: &[u8] = &[0x55, 0x04, 0x03];
/// OID 2.5.29.17, subject alternative name.
const OID_SAN: &[u8] = &[0x55, 0x1d, 0x11];

/// The certificate's names: the subject CN first, then each SAN of type rfc822Name, dNSName
/// or uniformResourceIdentifier, in the certificate's order.
pub fn names(der: &[u8]) -> Vec<String> {
    let mut out = Vec::new();
    let _ = collect(der, &mut out);
    out
}

fn collect(der: &[u8], out: &mut Vec<String>) -> Option<()> {
    let (_, cert, _) = tlv(der)?; // Certificate SEQUENCE
    let (_, tbs, _) = tlv(cert)?; // TBSCertificate SEQUENCE
    let mut rest = tbs;
    let mut fields = Vec::new();
    while !rest.is_empty() {
        let (tag, content, next) = tlv(rest)?;
        fields.push((tag, content));
        rest = next;
    }
    // version [0] is optional; then serial, signature, issuer, validity, subject.
    let skip = usize::from(fields.first()?.0 == 0xa0);
    let subject = fields.get(skip + 4)?.1;
    subject_cn(subject, out);
    for (tag, content) in &fields {
        if *tag == 0xa3 {
            let (_, exts, _) = tlv(content)?;
            extensions(exts, out);
        }
    }
    Some(())
}

/// The CN of a Name: SEQUENCE OF SET OF { OID, value }.
fn subject_cn(mut name: &[u8], out: &mut Vec<String>) -> Option<()> {
    while !name.is_empty() {
        let (_, set, next) = tlv(name)?;
        name = next;
        let mut attrs = set;
        while !attrs.is_empty() {
            let (_, attr, rest) = tlv(attrs)?;
            attrs = rest;
            let (tag, oid, value) = tlv(attr)?;
            if tag == 0x06 && oid == OID_CN {
                let (_, text, _) = tlv(value)?;
                out.push(String::from_utf8_lossy(text).into_owned());
            }
        }
    }
    Some(())
}

/// The SANs among the extensions: SEQUENCE OF { OID, [critical], OCTET STRING }.
fn extensions(mut exts: &[u8], out: &mut Vec<String>) -> Option<()> {
    while !exts.is_empty() {
        let (_, ext, next) = tlv(exts)?;
        exts = next;
        let (tag, oid, mut rest) = tlv(ext)?;
        if tag != 0x06 || oid != OID_SAN {
            continue;
        }
        let (mut tag, mut value, after) = tlv(rest)?;
        if tag == 0x01 {
            rest = after;
            (tag, value, _) = tlv(rest)?;
        }
        if tag != 0x04 {
            continue;
        }
        let (_, mut general, _) = tlv(value)?;
        while !general.is_empty() {
            let (tag, name, next) = tlv(general)?;
            general = next;
            // [1] rfc822Name, [2] dNSName, [6] uniformResourceIdentifier (IA5String).
            if matches!(tag, 0x81 | 0x82 | 0x86) {
                out.push(String::from_utf8_lossy(name).into_owned());
            }
        }
    }
    Some(())
}

/// One DER element: its tag, its content and what follows it. `None` when the lengths do
/// not fit the input.
fn tlv(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = input.split_first()?;
    let (&first, mut rest) = rest.split_first()?;
    let len = if first < 0x80 {
        usize::from(first)
    } else {
        let bytes = usize::from(first & 0x7f);
        if bytes == 0 || bytes > 4 || rest.len() < bytes {
            return None;
        }
        let (digits, after) = rest.split_at(bytes);
        rest = after;
        digits
            .iter()
            .fold(0usize, |n, &b| (n << 8) | usize::from(b))
    };
    if rest.len() < len {
        return None;
    }
    let (content, after) = rest.split_at(len);
    Some((tag, content, after))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_cn_and_sans_of_a_generated_certificate() {
        let mut params =
            rcgen::CertificateParams::new(vec!["svc.example".into(), "other.example".into()])
                .unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, "Example");
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "billing-service");
        params.subject_alt_names.push(rcgen::SanType::Rfc822Name(
            "ops@example.com".try_into().unwrap(),
        ));
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        assert_eq!(
            names(cert.der()),
            [
                "billing-service",
                "svc.example",
                "other.example",
                "ops@example.com"
            ]
        );
    }

    #[test]
    fn garbage_yields_no_names() {
        assert!(names(b"").is_empty());
        assert!(names(&[0x30, 0x84, 0xff, 0xff, 0xff, 0xff]).is_empty());
        assert!(names(&[0x30, 0x03, 0x30, 0x01]).is_empty());
    }
}

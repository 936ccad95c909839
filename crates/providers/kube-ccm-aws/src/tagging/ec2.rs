//! `CreateTags` and `DeleteTags`, and the refusals that concern one instance of a batch.

use std::collections::BTreeMap;

use aws_sdk_ec2::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_ec2::types::Tag;
use kube_ccm_provider::CloudError;

use crate::{AwsProvider, aws_error};

/// Why EC2 refused a request for one of its instances.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// An instance does not exist (or does not yet, for `CreateTags`).
    NotFound,
    /// An ID is not an instance ID.
    Invalid,
}

/// The instance-specific refusal an EC2 error code means, if any.
pub fn refused(code: Option<&str>) -> Option<Refused> {
    match code? {
        "InvalidInstanceID.NotFound" => Some(Refused::NotFound),
        // Moto answers InvalidID where EC2 answers InvalidInstanceID.Malformed.
        "InvalidInstanceID.Malformed" | "InvalidID" => Some(Refused::Invalid),
        _ => None,
    }
}

impl AwsProvider {
    /// `CreateTags` (`delete`: `DeleteTags`, for the same keys and values) on the instances `ids`.
    pub(super) async fn tag_instances(
        &self,
        ids: &[&str],
        tags: &BTreeMap<String, String>,
        delete: bool,
    ) -> Result<Result<(), Refused>, CloudError> {
        let resources: Vec<String> = ids.iter().map(|&id| id.to_owned()).collect();
        let tags: Vec<Tag> = tags
            .iter()
            .map(|(k, v)| Tag::builder().key(k).value(v).build())
            .collect();
        if delete {
            let sent = self
                .ec2
                .delete_tags()
                .set_resources(Some(resources))
                .set_tags(Some(tags))
                .send()
                .await;
            answer(sent.map(drop))
        } else {
            let sent = self
                .ec2
                .create_tags()
                .set_resources(Some(resources))
                .set_tags(Some(tags))
                .send()
                .await;
            answer(sent.map(drop))
        }
    }
}

/// A tags request's outcome: done, refused for an instance, or failed.
fn answer<E, R>(sent: Result<(), SdkError<E, R>>) -> Result<Result<(), Refused>, CloudError>
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    R: std::fmt::Debug + Send + Sync + 'static,
{
    match sent {
        Ok(()) => Ok(Ok(())),
        Err(error) => match refused(error.code()) {
            Some(refusal) => Ok(Err(refusal)),
            None => Err(aws_error(error)),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instance_refusals_are_told_from_other_errors() {
        assert_eq!(
            refused(Some("InvalidInstanceID.NotFound")),
            Some(Refused::NotFound)
        );
        assert_eq!(
            refused(Some("InvalidInstanceID.Malformed")),
            Some(Refused::Invalid)
        );
        assert_eq!(refused(Some("RequestLimitExceeded")), None);
        assert_eq!(refused(None), None);
    }
}

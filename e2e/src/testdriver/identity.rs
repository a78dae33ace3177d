//! The CSI Identity service of `csi-test-driver`: its name, that it has a
//! controller service and topology, and that it is ready.

use std::collections::HashMap;

use csiops_proto::csi::v1::{
    identity_server::Identity, plugin_capability, GetPluginCapabilitiesRequest,
    GetPluginCapabilitiesResponse, GetPluginInfoRequest, GetPluginInfoResponse, PluginCapability,
    ProbeRequest, ProbeResponse,
};
use tonic::Status;

use super::service::{csi_service, Driver};

impl Driver {
    pub(super) fn plugin_info(
        &self,
        _: GetPluginInfoRequest,
    ) -> Result<GetPluginInfoResponse, Status> {
        Ok(GetPluginInfoResponse {
            name: self.name.clone(),
            vendor_version: self.version.clone(),
            manifest: HashMap::new(),
        })
    }

    fn plugin_capabilities(
        &self,
        _: GetPluginCapabilitiesRequest,
    ) -> Result<GetPluginCapabilitiesResponse, Status> {
        use plugin_capability::{service::Type, Service, Type as T};
        Ok(GetPluginCapabilitiesResponse {
            capabilities: [
                Type::ControllerService,
                Type::VolumeAccessibilityConstraints,
            ]
            .into_iter()
            .map(|t| PluginCapability {
                r#type: Some(T::Service(Service { r#type: t as i32 })),
            })
            .collect(),
        })
    }

    fn probe(&self, _: ProbeRequest) -> Result<ProbeResponse, Status> {
        Ok(ProbeResponse { ready: Some(true) })
    }
}

csi_service!(Identity {
    get_plugin_info(GetPluginInfoRequest -> GetPluginInfoResponse) = "GetPluginInfo" => Driver::plugin_info;
    get_plugin_capabilities(GetPluginCapabilitiesRequest -> GetPluginCapabilitiesResponse) = "GetPluginCapabilities" => Driver::plugin_capabilities;
    probe(ProbeRequest -> ProbeResponse) = "Probe" => Driver::probe;
});

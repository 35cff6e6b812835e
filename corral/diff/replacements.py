"""Which input changes replace a resource, for the resource types corral registers.

The provider plugins, which know this authoritatively (their `Diff` call),
are not available where `corral diff` runs (CI, a laptop without cloud
credentials), so this is a small table kept by hand from the providers'
documentation and schemas. Each entry cites where it comes from.

Per resource type token, per input property (Pulumi's camelCase names; a
nested property is a dotted path, a prefix matches everything below it):

- REPLACE: the provider deletes and re-creates the resource (Terraform
  `ForceNew` for the bridged aws/gcp/tls/random providers; ARM properties
  without `update` mutability, and location/name, for azure-native).
- RESTART: updated in place, but the machine is stopped/started or rebooted.
- IN_PLACE: updated in place, no restart (listed where it matters for
  review, e.g. disk performance, or where a reader might expect otherwise).

A change to a property the table does not list is reported as an in-place
update, marked unverified. A type the table does not list at all is
reported the same way; add it here when corral starts registering it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

REPLACE = "replace"
RESTART = "restart"
IN_PLACE = "update"


@dataclass(frozen=True)
class Rule:
    source: str
    replace: dict[str, str] = field(default_factory=dict)
    restart: dict[str, str] = field(default_factory=dict)
    in_place: dict[str, str] = field(default_factory=dict)
    # Every input forces replacement (immutable resources: templates, keys).
    all_replace: str | None = None
    # (path, old, new) -> (effect, why) for value-dependent cases (disk shrink).
    special: Callable[[str, object, object], tuple[str, str] | None] | None = None


def _grow_only(prop: str) -> Callable[[str, object, object], tuple[str, str] | None]:
    def check(path: str, old: object, new: object) -> tuple[str, str] | None:
        if path == prop and isinstance(old, (int, float)) and isinstance(new, (int, float)) and new < old:
            return REPLACE, f"{prop} can only grow; a smaller disk is a new disk"
        return None
    return check


def _statefulset_volumes(path: str, old: object, new: object) -> tuple[str, str] | None:
    """A StatefulSet's volumeClaimTemplates are immutable: the API server refuses
    the apply (kubernetes.io/docs/concepts/workloads/controllers/statefulset/
    #volume-claim-templates), so the change needs the manual steps first."""
    if path.startswith("objs.spec.volumeClaimTemplates"):
        return REPLACE, ("a StatefulSet's volumeClaimTemplates cannot change in place (the API server refuses "
                         "the apply): resize its PVCs and delete the StatefulSet with --cascade=orphan before "
                         "deploying (docs/monitoring.md)")
    return None


_AWS = "https://www.pulumi.com/registry/packages/aws/api-docs/"
_AZ = "https://www.pulumi.com/registry/packages/azure-native/api-docs/"
_GCP = "https://www.pulumi.com/registry/packages/gcp/api-docs/"

RULES: dict[str, Rule] = {
    # --- AWS (pulumi-aws bridges terraform-provider-aws; ForceNew = replace) ---
    # aws_instance: ami, availability_zone, subnet_id, private_ip, key_name,
    # placement_group are ForceNew; instance_type and user_data "will trigger
    # a stop/start of the EC2 instance" (pulumi_aws ec2/instance.py docstrings,
    # and https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/change-instance-type-of-ebs-backed-instance.html).
    "aws:ec2:Instance": Rule(
        source=_AWS + "ec2/instance/",
        replace={
            "ami": "ForceNew: a new AMI is a new instance",
            "availabilityZone": "ForceNew: an instance cannot move between zones",
            "subnetId": "ForceNew",
            "privateIp": "ForceNew: the primary private address is fixed at launch",
            "keyName": "ForceNew",
            "placementGroup": "ForceNew",
            "ebsBlockDevices": "ForceNew: block device mappings are fixed at launch",
            "ephemeralBlockDevices": "ForceNew",
            "networkInterfaces": "ForceNew",
        },
        restart={
            "instanceType": "stop/start of the instance (EBS-backed types can change type only when stopped)",
            "userData": "stop/start of the instance (unless userDataReplaceOnChange, then replace)",
            "userDataBase64": "stop/start of the instance (unless userDataReplaceOnChange, then replace)",
        },
        in_place={
            "rootBlockDevice": "EBS Elastic Volumes modify the root volume online",
            "tags": "", "vpcSecurityGroupIds": "", "disableApiTermination": "", "metadataOptions": "",
        },
    ),
    # aws_ebs_volume: availability_zone, encrypted, kms_key_id, snapshot_id,
    # outpost_arn are ForceNew; size, type, iops and throughput change online
    # through Elastic Volumes (ModifyVolume; one modification per 6 hours):
    # https://docs.aws.amazon.com/ebs/latest/userguide/ebs-modify-volume.html
    "aws:ebs:Volume": Rule(
        source=_AWS + "ebs/volume/",
        replace={
            "availabilityZone": "ForceNew: a volume lives in one zone",
            "encrypted": "ForceNew", "kmsKeyId": "ForceNew", "snapshotId": "ForceNew", "outpostArn": "ForceNew",
        },
        in_place={
            "iops": "Elastic Volumes: online, at most one change per 6 hours",
            "throughput": "Elastic Volumes: online, at most one change per 6 hours",
            "type": "Elastic Volumes: online (e.g. gp3 <-> io2), at most one change per 6 hours",
            "size": "Elastic Volumes: online, grow only; the filesystem must be grown after",
        },
        special=_grow_only("size"),
    ),
    # aws_volume_attachment: device_name, instance_id, volume_id are ForceNew.
    "aws:ec2:VolumeAttachment": Rule(
        source=_AWS + "ec2/volumeattachment/",
        replace={"deviceName": "ForceNew", "instanceId": "ForceNew", "volumeId": "ForceNew"},
    ),
    # aws_launch_template: updates create a new template version in place.
    "aws:ec2:LaunchTemplate": Rule(
        source=_AWS + "ec2/launchtemplate/",
        replace={"name": "ForceNew", "namePrefix": "ForceNew"},
    ),
    # aws_autoscaling_group: sizes, zones/subnets and the template version
    # update in place; name is ForceNew.
    "aws:autoscaling:Group": Rule(
        source=_AWS + "autoscaling/group/",
        replace={"name": "ForceNew", "namePrefix": "ForceNew"},
        in_place={"minSize": "", "maxSize": "", "desiredCapacity": "", "launchTemplate": "", "vpcZoneIdentifiers": ""},
    ),
    # aws_vpc: cidr_block is ForceNew. aws_subnet: cidr_block,
    # availability_zone, vpc_id are ForceNew.
    "aws:ec2:Vpc": Rule(source=_AWS + "ec2/vpc/", replace={"cidrBlock": "ForceNew"}),
    "aws:ec2:Subnet": Rule(
        source=_AWS + "ec2/subnet/",
        replace={"cidrBlock": "ForceNew", "availabilityZone": "ForceNew", "vpcId": "ForceNew"},
    ),
    # aws_security_group: name, description, vpc_id are ForceNew.
    "aws:ec2:SecurityGroup": Rule(
        source=_AWS + "ec2/securitygroup/",
        replace={"name": "ForceNew", "description": "ForceNew", "vpcId": "ForceNew"},
    ),
    # aws_vpn_gateway: amazon_side_asn, availability_zone are ForceNew.
    "aws:ec2:VpnGateway": Rule(
        source=_AWS + "ec2/vpngateway/",
        replace={"amazonSideAsn": "ForceNew", "availabilityZone": "ForceNew"},
    ),
    # aws_customer_gateway: bgp_asn, ip_address, type are ForceNew.
    "aws:ec2:CustomerGateway": Rule(
        source=_AWS + "ec2/customergateway/",
        replace={"bgpAsn": "ForceNew", "ipAddress": "ForceNew", "type": "ForceNew"},
    ),
    # aws_vpn_connection: type, static_routes_only, transit_gateway_id are
    # ForceNew; tunnel options (pre-shared keys, ...) update in place, which
    # still resets the tunnels.
    "aws:ec2:VpnConnection": Rule(
        source=_AWS + "ec2/vpnconnection/",
        replace={"type": "ForceNew", "staticRoutesOnly": "ForceNew", "transitGatewayId": "ForceNew"},
        restart={"tunnel1PresharedKey": "the tunnel is re-established", "tunnel2PresharedKey": "the tunnel is re-established",
                 "customerGatewayId": "the connection is re-established"},
    ),
    "aws:ec2:Eip": Rule(source=_AWS + "ec2/eip/", replace={"domain": "ForceNew", "networkBorderGroup": "ForceNew"}),
    "aws:ec2:NatGateway": Rule(
        source=_AWS + "ec2/natgateway/",
        replace={"allocationId": "ForceNew", "subnetId": "ForceNew", "connectivityType": "ForceNew"},
    ),
    # aws_lb: internal, load_balancer_type, name are ForceNew.
    "aws:lb:LoadBalancer": Rule(
        source=_AWS + "lb/loadbalancer/",
        replace={"internal": "ForceNew", "loadBalancerType": "ForceNew", "name": "ForceNew", "namePrefix": "ForceNew"},
    ),
    # aws_lb_target_group: port, protocol, vpc_id, target_type, name are ForceNew.
    "aws:lb:TargetGroup": Rule(
        source=_AWS + "lb/targetgroup/",
        replace={"port": "ForceNew", "protocol": "ForceNew", "vpcId": "ForceNew", "targetType": "ForceNew",
                 "name": "ForceNew", "namePrefix": "ForceNew"},
    ),
    "aws:lb:TargetGroupAttachment": Rule(
        source=_AWS + "lb/targetgroupattachment/",
        replace={"targetGroupArn": "ForceNew", "targetId": "ForceNew", "port": "ForceNew"},
    ),

    # --- Azure (azure-native: create-only ARM properties, name and location replace) ---
    # Disks: "you can adjust the performance of Premium SSD v2 / Ultra disks
    # (IOPS, throughput) without detaching", up to four times in 24 hours;
    # a disk's zone and its type cannot be changed for Premium SSD v2 / Ultra
    # (conversion is snapshot + new disk):
    # https://learn.microsoft.com/azure/virtual-machines/disks-deploy-premium-v2#adjust-disk-performance
    # https://learn.microsoft.com/azure/virtual-machines/disks-convert-types
    "azure-native:compute:Disk": Rule(
        source=_AZ + "compute/disk/",
        replace={
            "sku": "Premium SSD v2 and Ultra disks cannot change type in place: a new disk (and a data copy)",
            "zones": "create-only: a disk stays in its zone",
            "location": "create-only",
            "creationData": "create-only (source, logical sector size)",
            "diskName": "the Azure resource name",
            "resourceGroupName": "create-only",
        },
        in_place={
            "diskIOPSReadWrite": "online, up to 4 changes per 24 hours",
            "diskMBpsReadWrite": "online, up to 4 changes per 24 hours",
            "diskSizeGB": "grow only",
        },
        special=_grow_only("diskSizeGB"),
    ),
    # VMs: resizing (vmSize) restarts the VM, and needs it deallocated when
    # the size is not offered on its current hardware cluster; zones and the
    # OS profile's identity are create-only:
    # https://learn.microsoft.com/azure/virtual-machines/sizes/resize-vm
    # https://learn.microsoft.com/azure/virtual-machines/disks-enable-ultra-ssd (ultraSSDEnabled needs a deallocated VM)
    "azure-native:compute:VirtualMachine": Rule(
        source=_AZ + "compute/virtualmachine/",
        replace={
            "zones": "create-only: a VM stays in its zone",
            "location": "create-only",
            "vmName": "the Azure resource name",
            "resourceGroupName": "create-only",
            "osProfile.computerName": "create-only",
            "osProfile.adminUsername": "create-only",
            "storageProfile.imageReference": "create-only (a new image needs a new VM or a reimage)",
            "storageProfile.osDisk.createOption": "create-only",
        },
        restart={
            "hardwareProfile.vmSize": "resize reboots the VM (deallocates it if the size is on other hardware)",
            "additionalCapabilities.ultraSSDEnabled": "only while the VM is deallocated",
        },
        in_place={"storageProfile.dataDisks": "attach/detach online", "tags": ""},
    ),
    # Scale sets: capacity and the VM model update in place (instances follow
    # the upgrade policy); name and location replace.
    "azure-native:compute:VirtualMachineScaleSet": Rule(
        source=_AZ + "compute/virtualmachinescaleset/",
        replace={"location": "create-only", "vmScaleSetName": "the Azure resource name",
                 "resourceGroupName": "create-only", "platformFaultDomainCount": "create-only"},
        in_place={"sku": "", "virtualMachineProfile": "model update; instances follow upgradePolicy"},
    ),
    "azure-native:monitor:AutoscaleSetting": Rule(
        source=_AZ + "monitor/autoscalesetting/",
        replace={"autoscaleSettingName": "the Azure resource name", "location": "create-only"},
        in_place={"profiles": "min/max/default capacity"},
    ),
    # VPN: a gateway's type and VPN type are fixed at creation
    # (https://learn.microsoft.com/azure/vpn-gateway/about-gateway-skus);
    # a new gateway is a new public address for the data centre's side.
    "azure-native:network:VirtualNetworkGateway": Rule(
        source=_AZ + "network/virtualnetworkgateway/",
        replace={"gatewayType": "fixed at creation", "vpnType": "fixed at creation", "location": "create-only",
                 "virtualNetworkGatewayName": "the Azure resource name", "resourceGroupName": "create-only"},
    ),
    "azure-native:network:VirtualNetworkGatewayConnection": Rule(
        source=_AZ + "network/virtualnetworkgatewayconnection/",
        replace={"connectionType": "fixed at creation", "location": "create-only",
                 "virtualNetworkGatewayConnectionName": "the Azure resource name"},
        restart={"sharedKey": "the tunnel is re-established"},
    ),
    "azure-native:network:LocalNetworkGateway": Rule(
        source=_AZ + "network/localnetworkgateway/",
        replace={"location": "create-only", "localNetworkGatewayName": "the Azure resource name"},
    ),
    "azure-native:network:PublicIPAddress": Rule(
        source=_AZ + "network/publicipaddress/",
        replace={"sku": "create-only", "zones": "create-only", "location": "create-only",
                 "publicIpAddressName": "the Azure resource name"},
    ),
    "azure-native:network:VirtualNetwork": Rule(
        source=_AZ + "network/virtualnetwork/",
        replace={"location": "create-only", "virtualNetworkName": "the Azure resource name"},
        in_place={"addressSpace": "address ranges can be added online"},
    ),
    "azure-native:network:NetworkInterface": Rule(
        source=_AZ + "network/networkinterface/",
        replace={"location": "create-only", "networkInterfaceName": "the Azure resource name"},
    ),
    "azure-native:resources:ResourceGroup": Rule(
        source=_AZ + "resources/resourcegroup/",
        replace={"location": "create-only", "resourceGroupName": "the Azure resource name"},
    ),

    # --- GCP (pulumi-gcp bridges terraform-provider-google; ForceNew = replace) ---
    # google_compute_disk: type, zone, name, image, snapshot,
    # physical_block_size_bytes are ForceNew; size grows in place;
    # provisioned_iops / provisioned_throughput update in place, for
    # Hyperdisk at most once every 4 hours:
    # https://cloud.google.com/compute/docs/disks/modify-hyperdisks
    "gcp:compute:Disk": Rule(
        source=_GCP + "compute/disk/",
        replace={
            "type": "ForceNew: a disk cannot change type (snapshot + new disk)",
            "zone": "ForceNew", "name": "ForceNew", "image": "ForceNew", "snapshot": "ForceNew",
            "physicalBlockSizeBytes": "ForceNew",
        },
        in_place={
            "provisionedIops": "online; Hyperdisk performance changes at most once per 4 hours",
            "provisionedThroughput": "online; Hyperdisk performance changes at most once per 4 hours",
            "size": "grow only",
        },
        special=_grow_only("size"),
    ),
    # google_compute_instance: zone, name, boot_disk (its initialize_params),
    # metadata_startup_script are ForceNew; machine_type, min_cpu_platform,
    # service_account, guest_accelerator need a stop and fail unless
    # allow_stopping_for_update is set (corral sets it):
    # https://cloud.google.com/compute/docs/instances/changing-machine-type-of-stopped-instance
    "gcp:compute:Instance": Rule(
        source=_GCP + "compute/instance/",
        replace={
            "zone": "ForceNew: an instance cannot move between zones",
            "name": "ForceNew",
            "bootDisk": "ForceNew: a new boot disk (image, size, type) is a new instance",
            "metadataStartupScript": "ForceNew",
            "scratchDisks": "ForceNew",
            "networkInterfaces.networkIp": "ForceNew: the primary internal address is fixed",
            "networkInterfaces.subnetwork": "ForceNew",
        },
        restart={
            "machineType": "stop/start (allowStoppingForUpdate)",
            "minCpuPlatform": "stop/start (allowStoppingForUpdate)",
            "serviceAccount": "stop/start (allowStoppingForUpdate)",
            "guestAccelerators": "stop/start (allowStoppingForUpdate)",
        },
        in_place={"metadata": "no restart; cloud-init does not run again", "labels": "", "tags": "",
                  "attachedDisks": "attach/detach online", "deletionProtection": ""},
    ),
    # Instance templates are immutable: every change is a new template; the
    # managed instance group then rolls its instances per its update policy.
    "gcp:compute:InstanceTemplate": Rule(
        source=_GCP + "compute/instancetemplate/",
        all_replace="instance templates are immutable (a new template; the MIG rolls to it)",
    ),
    "gcp:compute:RegionInstanceGroupManager": Rule(
        source=_GCP + "compute/regioninstancegroupmanager/",
        replace={"name": "ForceNew", "region": "ForceNew", "baseInstanceName": "ForceNew",
                 "distributionPolicyZones": "ForceNew"},
        in_place={"targetSize": "", "versions": "rolls instances per updatePolicy", "autoHealingPolicies": ""},
    ),
    "gcp:compute:RegionAutoscaler": Rule(
        source=_GCP + "compute/regionautoscaler/",
        replace={"name": "ForceNew", "region": "ForceNew"},
        in_place={"autoscalingPolicy": "min/max replicas", "target": ""},
    ),
    "gcp:compute:Network": Rule(
        source=_GCP + "compute/network/",
        replace={"name": "ForceNew", "autoCreateSubnetworks": "ForceNew", "mtu": "ForceNew"},
    ),
    "gcp:compute:Subnetwork": Rule(
        source=_GCP + "compute/subnetwork/",
        replace={"name": "ForceNew", "network": "ForceNew", "region": "ForceNew",
                 "ipCidrRange": "only expansion is in place; treated as a replacement"},
    ),
    "gcp:compute:Firewall": Rule(source=_GCP + "compute/firewall/", replace={"name": "ForceNew", "network": "ForceNew"}),
    "gcp:compute:Router": Rule(
        source=_GCP + "compute/router/",
        replace={"name": "ForceNew", "network": "ForceNew", "region": "ForceNew"},
    ),
    "gcp:compute:RouterNat": Rule(
        source=_GCP + "compute/routernat/",
        replace={"name": "ForceNew", "router": "ForceNew", "region": "ForceNew"},
    ),
    "gcp:compute:HaVpnGateway": Rule(
        source=_GCP + "compute/havpngateway/",
        replace={"name": "ForceNew", "network": "ForceNew", "region": "ForceNew", "vpnInterfaces": "ForceNew"},
    ),
    "gcp:compute:ExternalVpnGateway": Rule(source=_GCP + "compute/externalvpngateway/",
                                           all_replace="ForceNew on every argument but labels"),
    # google_compute_vpn_tunnel: every argument (shared secret, peer, IKE) is ForceNew.
    "gcp:compute:VpnTunnel": Rule(source=_GCP + "compute/vpntunnel/", all_replace="ForceNew on every argument but labels"),

    # --- Kubernetes add-ons (pulumi-kubernetes, corral/infra/addons.py) ---
    # yaml/v2 ConfigGroup re-applies its objects with server-side apply: a
    # changed object is patched in place (a Deployment rolls its pods);
    # objects gone from `objs` are deleted. kubernetes_provider_docs:
    # https://www.pulumi.com/registry/packages/kubernetes/api-docs/yaml/v2/configgroup/
    "kubernetes:yaml:ConfigGroup": Rule(
        source="https://www.pulumi.com/registry/packages/kubernetes/api-docs/yaml/v2/configgroup/",
        in_place={"objs": "server-side apply of the changed objects"},
        special=_statefulset_volumes,
    ),
    "kubernetes:core:ConfigMap": Rule(
        source="https://www.pulumi.com/registry/packages/kubernetes/api-docs/core/v1/configmap/",
        replace={"metadata.name": "a new name is a new object", "metadata.namespace": "a new namespace is a new object"},
    ),

    # --- Keys and random values: every input forces a new key/value ---
    "tls:index:PrivateKey": Rule(source="https://www.pulumi.com/registry/packages/tls/api-docs/privatekey/",
                                 all_replace="every argument is ForceNew: a new key"),
    "tls:index:SelfSignedCert": Rule(source="https://www.pulumi.com/registry/packages/tls/api-docs/selfsignedcert/",
                                     all_replace="every argument is ForceNew: a new certificate"),
    "tls:index:LocallySignedCert": Rule(source="https://www.pulumi.com/registry/packages/tls/api-docs/locallysignedcert/",
                                        all_replace="every argument is ForceNew: a new certificate"),
    "tls:index:CertRequest": Rule(source="https://www.pulumi.com/registry/packages/tls/api-docs/certrequest/",
                                  all_replace="every argument is ForceNew"),
    "random:index:RandomPassword": Rule(source="https://www.pulumi.com/registry/packages/random/api-docs/randompassword/",
                                        all_replace="every argument (and keepers) is ForceNew: a new value"),
    "random:index:RandomId": Rule(source="https://www.pulumi.com/registry/packages/random/api-docs/randomid/",
                                  all_replace="every argument (and keepers) is ForceNew: a new value"),
    "random:index:RandomString": Rule(source="https://www.pulumi.com/registry/packages/random/api-docs/randomstring/",
                                      all_replace="every argument (and keepers) is ForceNew: a new value"),
}

# Inputs that never change what is deployed.
COSMETIC = {"tags", "labels", "description"}


def _camel(segment: str) -> str:
    if "_" not in segment:
        return segment
    head, *rest = segment.split("_")
    return head + "".join(p[:1].upper() + p[1:] for p in rest)


_INDEX = re.compile(r"\[\d+\]")


def normalise(path: str) -> str:
    """`network_interfaces[0].network_ip` -> `networkInterfaces.networkIp`."""
    return ".".join(_camel(p) for p in _INDEX.sub("", path).split(".") if p)


def _lookup(table: dict[str, str], path: str) -> tuple[str, str] | None:
    """The entry whose key is `path` or a prefix of it (longest first)."""
    parts = path.split(".")
    for n in range(len(parts), 0, -1):
        key = ".".join(parts[:n])
        if key in table:
            return key, table[key]
    return None


def effect(type_token: str, path: str, old: object, new: object) -> tuple[str, str, bool]:
    """(effect, why, known) of a change of input `path` of a `type_token` resource."""
    rule = RULES.get(type_token)
    if rule is None:
        return IN_PLACE, f"{type_token} is not in corral's replacement table", False
    norm = normalise(path)
    if rule.special is not None:
        found = rule.special(norm, old, new)
        if found is not None:
            return found[0], found[1], True
    if rule.all_replace and norm.split(".")[0] not in COSMETIC:
        return REPLACE, rule.all_replace, True
    for kind, table in ((REPLACE, rule.replace), (RESTART, rule.restart), (IN_PLACE, rule.in_place)):
        hit = _lookup(table, norm)
        if hit is not None:
            return kind, hit[1] or "updated in place", True
    if norm.split(".")[0] in COSMETIC:
        return IN_PLACE, "metadata only", True
    return IN_PLACE, "not in corral's replacement table for this type; the provider decides", False

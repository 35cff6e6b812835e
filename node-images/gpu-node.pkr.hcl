# corral node images: one template, three clouds, the SAME Ansible roles that
# join on-prem machines (ansible/roles), so a cloud GPU node and a bare-metal
# one run the same driver, container runtime and kubelet bits.
#
# Build one cloud's image:
#   packer build -only='amazon-ebs.gpu-node' -var kubernetes_version=1.36.4 node-images/
# The image stops short of joining: cloud nodes join at boot from the
# cloud-init the Pulumi program renders (the shared JoinConfiguration).

variable "kubernetes_version" {
  type        = string
  description = "Kubernetes version of kubeadm/kubelet baked in, e.g. 1.36.4 (the cluster file's kubernetes.version)."
}

variable "nvidia_driver_version" {
  type        = string
  default     = "580.173.02"
  description = "NVIDIA driver baked in; match the GPU pools' gpu.driver."
}

variable "containerd_version" {
  type        = string
  default     = "2.3.6"
  description = "containerd (Docker's containerd.io) baked in; match the cluster's kubernetes.containerd (corral show NAME): the version catalog's default for its Kubernetes minor, 2.3.6 for 1.34 to 1.37."
}

variable "pause_image" {
  type        = string
  default     = "registry.k8s.io/pause:3.10.2"
  description = "The sandbox image containerd pins: kubeadm's for the cluster's Kubernetes minor (the version catalog's pause: 3.10.1 for 1.35, 3.10.2 for 1.36 and 1.37)."
}

variable "fabric_manager" {
  type        = bool
  default     = true
  description = "Bake NVIDIA Fabric Manager (enabled for the first boot): machines with NVSwitches (8-GPU H100/H200/A100 SXM: p4d/p5, ND H100 v5, a3). false for PCIe GPU machines (g5, g6, NC)."
}

variable "image_name" {
  type    = string
  default = "corral-gpu-node"
}

# --- AWS -----------------------------------------------------------------------
variable "aws_region" {
  type    = string
  default = "us-west-2"
}

# --- Azure ---------------------------------------------------------------------
variable "azure_subscription_id" {
  type    = string
  default = null
}
variable "azure_resource_group" {
  type    = string
  default = "corral-images"
}
variable "azure_location" {
  type    = string
  default = "eastus2"
}

# --- GCP -----------------------------------------------------------------------
variable "gcp_project" {
  type    = string
  default = null
}
variable "gcp_zone" {
  type    = string
  default = "us-central1-a"
}

locals {
  # Image names carry the versions so a pool's image says what it runs.
  image_id = "${var.image_name}-k8s-${replace(var.kubernetes_version, ".", "-")}-nvidia-${replace(var.nvidia_driver_version, ".", "-")}"
}

source "amazon-ebs" "gpu-node" {
  region        = var.aws_region
  instance_type = "g5.xlarge"
  ami_name      = "${local.image_id}-{{timestamp}}"
  ssh_username  = "admin"
  source_ami_filter {
    # Debian 12 (bookworm), the release the roles are tested on.
    filters = {
      name                = "debian-12-amd64-*"
      virtualization-type = "hvm"
      root-device-type    = "ebs"
    }
    owners      = ["136693071363"] # Debian's official AWS account
    most_recent = true
  }
  launch_block_device_mappings {
    device_name           = "/dev/xvda"
    volume_size           = 60
    volume_type           = "gp3"
    iops                  = 3000
    throughput            = 125
    delete_on_termination = true
  }
}

source "azure-arm" "gpu-node" {
  use_azure_cli_auth                = true
  subscription_id                   = var.azure_subscription_id
  location                          = var.azure_location
  vm_size                           = "Standard_NC4as_T4_v3"
  os_type                           = "Linux"
  image_publisher                   = "Debian"
  image_offer                       = "debian-12"
  image_sku                         = "12-gen2"
  managed_image_name                = local.image_id
  managed_image_resource_group_name = var.azure_resource_group
}

source "googlecompute" "gpu-node" {
  project_id          = var.gcp_project
  zone                = var.gcp_zone
  machine_type        = "g2-standard-4"
  source_image_family = "debian-12"
  image_name          = local.image_id
  image_family        = var.image_name
  ssh_username        = "packer"
  disk_size           = 60
  on_host_maintenance = "TERMINATE" # GPU machines cannot live-migrate
}

build {
  sources = [
    "source.amazon-ebs.gpu-node",
    "source.azure-arm.gpu-node",
    "source.googlecompute.gpu-node",
  ]

  provisioner "ansible" {
    playbook_file = "${path.root}/image.yml"
    user          = build.User
    extra_arguments = [
      "--extra-vars", "corral_kubernetes_version=${var.kubernetes_version}",
      "--extra-vars", "corral_nvidia_driver_version=${var.nvidia_driver_version}",
      "--extra-vars", "corral_containerd_version=${var.containerd_version}",
      "--extra-vars", "corral_containerd_sandbox_image=${var.pause_image}",
      "--extra-vars", "corral_image_fabric_manager=${var.fabric_manager}",
    ]
    ansible_env_vars = [
      "ANSIBLE_CONFIG=${path.root}/../ansible/ansible.cfg",
      "ANSIBLE_ROLES_PATH=${path.root}/../ansible/roles",
    ]
  }
}

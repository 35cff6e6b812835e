"""The bootstrap lab: corral's etcd user data under real cloud-init on throwaway hosts."""

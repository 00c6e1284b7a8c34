{{/*
The config-manager (nvdp config-manager), as in NVIDIA's chart: when the pods use a ConfigMap of
config entries (config.name or config.map), an init container links /config/config.yaml to the
entry the node label nvidia.com/device-plugin.config selects (else config.default, else
config.fallbackStrategies), and a sidecar keeps following the label and the ConfigMap's content,
signalling the plugin (SIGHUP; the pod shares one process namespace) when the file changed.
With rbac.create the config-managers also watch that ConfigMap through the API (CONFIGMAP_NAME,
NAMESPACE; config-manager-rbac.yml grants get, list and watch on it alone), so an edit applies in
seconds instead of when the kubelet refreshes the mounted copy, which stays the fallback.
The GFD pod (gfd.enabled) gets the same pair, signalling gpu-feature-discovery, so its labels
follow the same node label; so does the MPS control daemon pod, signalling mps-control-daemon, and
the DRA kubelet plugin's pod (dra.enabled), signalling gpu-kubelet-plugin.
"configManager" is "true" when it is used.
*/}}
{{- define "nvidia-device-plugin.configManager" -}}
{{- ne (include "nvidia-device-plugin.configMapName" .) "" }}
{{- end }}

{{/*
One config-manager container; call with (dict "root" $ "oneshot" true|false "process" NAME).
"process" is the console script of the pod's main container, the process the sidecar signals
(default nvidia-device-plugin; the GFD pod passes gpu-feature-discovery, the MPS control daemon
pod mps-control-daemon, the DRA kubelet plugin's pod gpu-kubelet-plugin); the container is named
<process>-init or <process>-sidecar, as in NVIDIA's chart.
*/}}
{{- define "nvidia-device-plugin.configManagerContainer" -}}
{{- $root := .root }}
{{- $process := .process | default "nvidia-device-plugin" }}
- name: {{ printf "%s-%s" $process (.oneshot | ternary "init" "sidecar") }}
  image: {{ include "nvidia-device-plugin.image" $root }}
  imagePullPolicy: {{ $root.Values.image.pullPolicy }}
  command: ["nvdp", "config-manager"]
  env:
    - name: ONESHOT
      value: {{ .oneshot | quote }}
    - name: KUBECONFIG
      value: ""
    - name: NODE_NAME
      valueFrom:
        fieldRef:
          fieldPath: spec.nodeName
    {{- if not .oneshot }}
    # At stop the sidecar asks whether its DaemonSet is being deleted (an uninstall: it removes the
    # Node annotation it wrote; uninstall-cleanup.yml).
    - name: POD_NAME
      valueFrom:
        fieldRef:
          fieldPath: metadata.name
    - name: POD_NAMESPACE
      valueFrom:
        fieldRef:
          fieldPath: metadata.namespace
    {{- end }}
    - name: NODE_LABEL
      value: "nvidia.com/device-plugin.config"
    - name: CONFIG_FILE_SRCDIR
      value: /available-configs
    - name: CONFIG_FILE_DST
      value: /config/config.yaml
    - name: DEFAULT_CONFIG
      value: {{ $root.Values.config.default | default "" | quote }}
    - name: FALLBACK_STRATEGIES
      value: {{ $root.Values.config.fallbackStrategies | default list | join "," | quote }}
    - name: SEND_SIGNAL
      value: {{ not .oneshot | quote }}
    - name: SIGNAL
      value: "1"
    - name: PROCESS_TO_SIGNAL
      value: {{ $process }}
    {{- if $root.Values.rbac.create }}
    - name: CONFIGMAP_NAME
      value: {{ include "nvidia-device-plugin.configMapName" $root | quote }}
    - name: NAMESPACE
      valueFrom:
        fieldRef:
          fieldPath: metadata.namespace
    {{- end }}
  securityContext:
    allowPrivilegeEscalation: false
    capabilities:
      drop: ["ALL"]
  {{- with ($root.Values.config.managerResources | default dict) }}
  resources:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  volumeMounts:
    - name: available-configs
      mountPath: /available-configs
      readOnly: true
    - name: config
      mountPath: /config
{{- end }}

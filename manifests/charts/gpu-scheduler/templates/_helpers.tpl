{{- define "gpu-scheduler.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- /* The release's name, with the chart's unless it holds it already:
the objects, the lease and the ConfigMap of release gpu-scheduler are named
gpu-scheduler, as in manifests/. Cluster-scoped objects carry it too, so
that two releases do not collide. */ -}}
{{- define "gpu-scheduler.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "gpu-scheduler.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "gpu-scheduler.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpu-scheduler.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "gpu-scheduler.labels" -}}
helm.sh/chart: {{ include "gpu-scheduler.chart" . }}
{{ include "gpu-scheduler.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: scheduler
{{- end -}}

{{- define "gpu-scheduler.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "gpu-scheduler.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- /* The user the API server sees: the admission policies match it. */ -}}
{{- define "gpu-scheduler.user" -}}
{{- printf "system:serviceaccount:%s:%s" .Release.Namespace (include "gpu-scheduler.serviceAccountName" .) -}}
{{- end -}}

{{- /* 'a', 'b': CEL string literals. */ -}}
{{- define "gpu-scheduler.quoteAll" -}}
{{- $q := list -}}
{{- range . -}}
{{- $q = append $q (printf "'%s'" .) -}}
{{- end -}}
{{- join ", " $q -}}
{{- end -}}

{{- define "gpu-scheduler.configMapName" -}}
{{- printf "%s-config" (include "gpu-scheduler.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- /* The objects of a file made for release gpu-scheduler in kube-system
(manifests/), for this release: names, the ServiceAccount (user, subjects),
the namespace (but the role kube-system holds for the secure port's
delegated authentication), the lease, the roles and policies referred to.
Arguments: the root, the file's text, the names (as in the file) to leave
out. YAML documents. */ -}}
{{- define "gpu-scheduler.rename" -}}
{{- $root := index . 0 -}}
{{- $skip := index . 2 -}}
{{- $full := include "gpu-scheduler.fullname" $root -}}
{{- $sa := include "gpu-scheduler.serviceAccountName" $root -}}
{{- $raw := index . 1 | replace "system:serviceaccount:kube-system:gpu-scheduler" (include "gpu-scheduler.user" $root) -}}
{{- range $doc := regexSplit "(?m)^---[ \\t]*$" $raw -1 -}}
{{- $o := fromYaml $doc -}}
{{- if and $o.kind (not (has $o.metadata.name $skip)) }}
{{- $orig := $o.metadata.name -}}
{{- $_ := set $o.metadata "name" (printf "%s%s" $full (trimPrefix "gpu-scheduler" $orig)) -}}
{{- if eq $o.kind "ServiceAccount" -}}
{{- $_ := set $o.metadata "name" $sa -}}
{{- end -}}
{{- if and $o.metadata.namespace (not (hasSuffix "-extension-apiserver-authentication-reader" $orig)) -}}
{{- $_ := set $o.metadata "namespace" $root.Release.Namespace -}}
{{- end -}}
{{- $_ := set $o.metadata "labels" (include "gpu-scheduler.labels" $root | fromYaml) -}}
{{- range $sub := $o.subjects -}}
{{- $_ := set $sub "name" $sa -}}
{{- $_ := set $sub "namespace" $root.Release.Namespace -}}
{{- end -}}
{{- if and $o.roleRef (hasPrefix "gpu-scheduler" $o.roleRef.name) -}}
{{- $_ := set $o.roleRef "name" (printf "%s%s" $full (trimPrefix "gpu-scheduler" $o.roleRef.name)) -}}
{{- end -}}
{{- range $rule := $o.rules -}}
{{- if has "leases" $rule.resources -}}
{{- $_ := set $rule "resourceNames" (list $full) -}}
{{- end -}}
{{- end -}}
{{- if and $o.spec (hasKey $o.spec "policyName") -}}
{{- $_ := set $o.spec "policyName" (printf "%s%s" $full (trimPrefix "gpu-scheduler" $o.spec.policyName)) -}}
{{- end }}
---
{{ toYaml $o }}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "gpu-scheduler.config" -}}
{{- if not (has .Values.nodeAgent (list "hami" "plain")) -}}
{{- fail (printf "nodeAgent must be hami or plain, not %q" .Values.nodeAgent) -}}
{{- end -}}
{{- $cfg := .Files.Get "files/scheduler-config.yaml" | fromYaml -}}
{{- $_ := set $cfg.leaderElection "leaderElect" .Values.leaderElection -}}
{{- $_ := set $cfg.leaderElection "resourceName" (include "gpu-scheduler.fullname" .) -}}
{{- $_ := set $cfg.leaderElection "resourceNamespace" .Release.Namespace -}}
{{- $profile := index $cfg.profiles 0 -}}
{{- $_ := set $profile "schedulerName" .Values.schedulerName -}}
{{- $seen := dict -}}
{{- range $pc := $profile.pluginConfig -}}
{{- $_ := set $seen $pc.name true -}}
{{- if eq $pc.name "GPUFit" -}}
{{- $_ := set $pc.args "accountingOnlySharing" $.Values.accountingOnlySharing -}}
{{- $_ := set $pc.args.hami "enabled" (eq $.Values.nodeAgent "hami") -}}
{{- end -}}
{{- with index $.Values.pluginArgs $pc.name -}}
{{- $_ := set $pc "args" (mustMergeOverwrite $pc.args .) -}}
{{- end -}}
{{- /* The learned target goes on this release's lease (none without
leader election: no lease). */ -}}
{{- if and (eq $pc.name "GPUScore") $pc.args.targetWorkload -}}
{{- if and $.Values.leaderElection (eq ($pc.args.targetWorkload.mode | default "Learned") "Learned") -}}
{{- $_ := set $pc.args.targetWorkload "publishTo" (printf "%s/%s" $.Release.Namespace (include "gpu-scheduler.fullname" $)) -}}
{{- else -}}
{{- $_ := unset $pc.args.targetWorkload "publishTo" -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- range $name, $args := .Values.pluginArgs -}}
{{- if not (hasKey $seen $name) -}}
{{- $_ := set $profile "pluginConfig" (append $profile.pluginConfig (dict "name" $name "args" $args)) -}}
{{- end -}}
{{- end -}}
{{- toYaml $cfg -}}
{{- end -}}

// The work item of an invocation in a dispatch of nodes.grid_groups (an invocation per item, no
// grid-stride loop): rows of gl_NumWorkGroups.x workgroups, item y * (groups.x * local) + x;
// invocations past the last item idle.
#define GRID_ITEM (gl_GlobalInvocationID.y * gl_NumWorkGroups.x * gl_WorkGroupSize.x + gl_GlobalInvocationID.x)
